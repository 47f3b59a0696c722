import { ApiError } from '../../core/errors.ts';
import { dict } from '../../core/own.ts';
import { PROBLEMS } from '../../core/problem.ts';
import type { Queryable } from '../../core/sql.ts';
import type { BrokerAgent } from './agents.ts';
import { auditedChange, type BrokerActor } from './audit.ts';
import type { BrokerDeps } from './deps.ts';

// The enclave's secrets (broker_secrets): values sealed under the broker's data key (sealer.ts), each at
// one scope of an org: the org itself, one of its groups, or one of its agents. An agent's secrets are
// the three scopes merged, the narrower winning (org → group → agent).
//
// Names are 1–200 characters of [A-Za-z0-9._:-]. A name with a `:` carries a service prefix
// (`llmproxy:llm.api_key`, `agent:llmproxy.llm.api_key`): a satellite secret, served to satellites
// only, never to the agent itself (agentSecrets drops them).
//
// Every write bumps broker_secrets_version in its own transaction, and once that transaction has
// committed the new version goes out on the bus ('secrets'): the satellites' event stream carries it,
// and they fetch the whole map again (satellite-routes.ts). A value never reaches a log line, an audit
// record or a listing: those name the secret and its scope.

export const SECRET_NAME = /^[A-Za-z0-9._:-]{1,200}$/;
/** A value's ceiling, in UTF-8 bytes. */
export const MAX_SECRET_BYTES = 64 * 1024;

export type SecretScope =
  | { kind: 'org'; org: string }
  | { kind: 'group'; org: string; group: string }
  | { kind: 'agent'; org: string; uid: string };

export interface SecretListing {
  name: string;
  scope: string;
  updated_at: string;
}

/** `org:O`, `group:O:G` or `agent:UID`. */
export function scopeName(s: SecretScope): string {
  if (s.kind === 'org') return `org:${s.org}`;
  if (s.kind === 'group') return `group:${s.org}:${s.group}`;
  return `agent:${s.uid}`;
}

const scopeId = (s: SecretScope): string => (s.kind === 'org' ? s.org : s.kind === 'group' ? s.group : s.uid);

/** Whether the agent itself may be served a secret of this name (satellite secrets carry a `:`). */
export const agentSecretName = (name: string): boolean => !name.includes(':');

async function bump(tx: Queryable): Promise<number> {
  const { rows } = await tx.query<{ version: string | number }>(
    'UPDATE broker_secrets_version SET version = version + 1 WHERE id = 1 RETURNING version',
  );
  return Number(rows[0]!.version);
}

/** The version of the secrets as a whole (bumped by every write). */
export async function secretsVersion(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ version: string | number }>(
    'SELECT version FROM broker_secrets_version WHERE id = 1',
  );
  return Number(rows[0]?.version ?? 0);
}

/**
 * Sets a secret at a scope (sealed before it is stored), audited (capture-or-deny), then announced on
 * the bus once committed. The caller has checked the name, the value and the scope.
 */
export async function putSecret(
  deps: BrokerDeps,
  actor: BrokerActor,
  scope: SecretScope,
  name: string,
  value: string,
): Promise<{ name: string; scope: string }> {
  const sealed = await deps.sealer.seal(value);
  const scopeText = scopeName(scope);
  const version = await auditedChange(deps, actor, 'secret.put', scope.org, async (tx) => {
    await tx.query(
      `INSERT INTO broker_secrets (scope_kind, org_id, scope_id, name, sealed, updated_at)
       VALUES ($1, $2, $3, $4, $5, now())
       ON CONFLICT (scope_kind, org_id, scope_id, name) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now()`,
      [scope.kind, scope.org, scopeId(scope), name, sealed],
    );
    return { result: await bump(tx), ...auditOf(scopeText, name) };
  });
  deps.bus.emit('secrets', version);
  return { name, scope: scopeText };
}

/** Deletes a secret at a scope; 404 (nothing audited, nothing bumped) when there is none. */
export async function deleteSecret(
  deps: BrokerDeps,
  actor: BrokerActor,
  scope: SecretScope,
  name: string,
): Promise<void> {
  const scopeText = scopeName(scope);
  const version = await auditedChange(deps, actor, 'secret.delete', scope.org, async (tx) => {
    const { rows } = await tx.query(
      `DELETE FROM broker_secrets WHERE scope_kind = $1 AND org_id = $2 AND scope_id = $3 AND name = $4
       RETURNING name`,
      [scope.kind, scope.org, scopeId(scope), name],
    );
    if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no secret ${name} at ${scopeText}`);
    return { result: await bump(tx), ...auditOf(scopeText, name) };
  });
  deps.bus.emit('secrets', version);
}

const auditOf = (scope: string, name: string) => ({
  resource: `secret:${scope}:${name}`,
  attrs: { secret: name, secret_scope: scope },
});

/** An org's secrets: names, scopes and when each was last written; never a value. */
export async function listSecrets(db: Queryable, org: string): Promise<SecretListing[]> {
  const { rows } = await db.query<{
    scope_kind: SecretScope['kind'];
    org_id: string;
    scope_id: string;
    name: string;
    updated_at: Date | string;
  }>(
    `SELECT scope_kind, org_id, scope_id, name, updated_at FROM broker_secrets WHERE org_id = $1
     ORDER BY CASE scope_kind WHEN 'org' THEN 0 WHEN 'group' THEN 1 ELSE 2 END, scope_id, name`,
    [org],
  );
  return rows.map((r) => ({
    name: r.name,
    scope: scopeName(scopeOfRow(r)),
    updated_at: new Date(r.updated_at).toISOString(),
  }));
}

interface SealedRow {
  scope_kind: SecretScope['kind'];
  org_id: string;
  scope_id: string;
  name: string;
  sealed: string;
}

function scopeOfRow(r: { scope_kind: string; org_id: string; scope_id: string }): SecretScope {
  if (r.scope_kind === 'group') return { kind: 'group', org: r.org_id, group: r.scope_id };
  if (r.scope_kind === 'agent') return { kind: 'agent', org: r.org_id, uid: r.scope_id };
  return { kind: 'org', org: r.org_id };
}

/** Narrowest last: org, then group, then agent. */
const RANK: Record<string, number> = { org: 0, group: 1, agent: 2 };

/**
 * Every secret of an agent, satellite names included, `{name: value}` merged org → group → agent (the
 * narrower scope wins).
 */
export async function allSecretsOf(
  deps: Pick<BrokerDeps, 'db' | 'sealer'>,
  agent: Pick<BrokerAgent, 'uid' | 'org_id' | 'group_id'>,
): Promise<Record<string, string>> {
  const { rows } = await deps.db.query<SealedRow>(
    `SELECT scope_kind, org_id, scope_id, name, sealed FROM broker_secrets
      WHERE org_id = $1 AND (scope_kind = 'org' AND scope_id = $1
                          OR scope_kind = 'group' AND scope_id = $2
                          OR scope_kind = 'agent' AND scope_id = $3)`,
    [agent.org_id, agent.group_id ?? '', agent.uid],
  );
  // A group-scoped row for an agent without a group cannot match: group ids are never empty.
  const out = dict<string>();
  for (const r of rows.sort((a, b) => RANK[a.scope_kind]! - RANK[b.scope_kind]!))
    if (r.scope_kind !== 'group' || agent.group_id) out[r.name] = await deps.sealer.open(r.sealed);
  return out;
}

/** The agent's own secrets: names without a `:` only, merged org → group → agent. */
export async function agentSecrets(
  deps: Pick<BrokerDeps, 'db' | 'sealer'>,
  agent: Pick<BrokerAgent, 'uid' | 'org_id' | 'group_id'>,
): Promise<Record<string, string>> {
  const all = await allSecretsOf(deps, agent);
  const out = dict<string>();
  for (const [name, value] of Object.entries(all)) if (agentSecretName(name)) out[name] = value;
  return out;
}

export interface SatelliteSecrets {
  version: number;
  /** Every agent the broker knows, its secrets merged org → group → agent (satellite names included). */
  agents: Record<string, Record<string, string>>;
  /** Each org's org-scope secrets. */
  orgs: Record<string, Record<string, string>>;
}

/**
 * What a satellite is served: every agent's merged map and every org's own. The version is read before
 * the secrets: a write committed in between shows in the secrets under the older version, and its event
 * (the newer version) makes the satellite fetch again, so a satellite never keeps a version newer than
 * what it holds.
 */
export async function satelliteSecrets(deps: Pick<BrokerDeps, 'db' | 'sealer'>): Promise<SatelliteSecrets> {
  const version = await secretsVersion(deps.db);
  const { rows } = await deps.db.query<SealedRow>(
    'SELECT scope_kind, org_id, scope_id, name, sealed FROM broker_secrets',
  );
  const agentRows = await deps.db.query<Pick<BrokerAgent, 'uid' | 'org_id' | 'group_id'>>(
    'SELECT uid, org_id, group_id FROM broker_agents ORDER BY uid',
  );
  // Each value is opened once, then placed wherever it applies.
  const byOrg = new Map<string, Record<string, string>>();
  const byGroup = new Map<string, Record<string, string>>();
  const byAgent = new Map<string, Record<string, string>>();
  const at = (m: Map<string, Record<string, string>>, key: string) => {
    let entry = m.get(key);
    if (!entry) m.set(key, (entry = dict<string>()));
    return entry;
  };
  for (const r of rows) {
    const value = await deps.sealer.open(r.sealed);
    if (r.scope_kind === 'org') at(byOrg, r.org_id)[r.name] = value;
    else if (r.scope_kind === 'group') at(byGroup, JSON.stringify([r.org_id, r.scope_id]))[r.name] = value;
    else at(byAgent, JSON.stringify([r.org_id, r.scope_id]))[r.name] = value;
  }
  const agents = dict<Record<string, string>>();
  for (const a of agentRows.rows)
    agents[a.uid] = Object.assign(
      dict<string>(),
      byOrg.get(a.org_id),
      a.group_id ? byGroup.get(JSON.stringify([a.org_id, a.group_id])) : undefined,
      byAgent.get(JSON.stringify([a.org_id, a.uid])),
    );
  const orgs = dict<Record<string, string>>();
  for (const [org, values] of byOrg) orgs[org] = values;
  return { version, agents, orgs };
}
