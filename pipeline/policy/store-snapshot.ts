import { validateSnapshot, type Snapshot } from './snapshot.ts';
import type { Queryable } from '../../core/sql.ts';

// The snapshot an enclave converges on (docs/snapshot.md), built from the store: the platform's
// llmproxy rows, every org the enclave serves (its owner and the orgs of the agents it runs) with
// their rows, groups and flags, and the agents it runs. The result goes through the proxy's own
// validator, so what an enclave receives is exactly what its llmproxy accepts. The same builder serves
// the operator's "effective policy" read, so the API shows what the proxy enforces.

const SERVICE = 'llmproxy';

/** The PostgreSQL NOTIFY channel the control plane signals on every committed change of this state. */
export const CHANGES_CHANNEL = 'dvx_events';

type Rows = Record<string, { value: unknown; locked: boolean }>;

async function rowsOf(db: Queryable, scope: 'platform' | 'org' | 'group', org = '', group = ''): Promise<Rows> {
  const { rows } = await db.query<{ key: string; value: string; locked: boolean }>(
    'SELECT key, value, locked FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 ORDER BY key',
    [SERVICE, scope, org, group],
  );
  return Object.fromEntries(rows.map((r) => [r.key, { value: JSON.parse(r.value), locked: r.locked }]));
}

async function orgState(db: Queryable, org: string) {
  const flags = (await db.query<{ flag: string; enabled: boolean }>('SELECT flag, enabled FROM feature_flags WHERE org_id = $1', [org])).rows;
  const groupIds = (await db.query<{ group_id: string }>(
    `SELECT DISTINCT group_id FROM service_config WHERE service = $1 AND scope_kind = 'group' AND org_id = $2 ORDER BY group_id`, [SERVICE, org],
  )).rows.map((r) => r.group_id);
  const groups: Record<string, { config: Rows }> = {};
  for (const g of groupIds) groups[g] = { config: await rowsOf(db, 'group', org, g) };
  // Packs carrying LLM policy, installed at platform scope or at this org's scope.
  const packs = (await db.query<{ name: string; config: string }>(
    `SELECT DISTINCT p.name, p.config FROM pack_installs i JOIN policy_packs p ON p.name = i.pack
      WHERE p.config <> '{}' AND (i.scope_kind = 'platform' OR (i.scope_kind = 'org' AND i.org_id = $1)) ORDER BY p.name`, [org],
  )).rows.map((r) => ({ name: r.name, config: JSON.parse(r.config) as Record<string, unknown> }));
  return { config: await rowsOf(db, 'org', org), flags: Object.fromEntries(flags.map((f) => [f.flag, f.enabled])), groups, packs };
}

interface AgentRow { uid: string; org_id: string; group_id: string; name: string; status: string; contained: boolean }

async function agentState(db: Queryable, a: AgentRow) {
  const { rows } = await db.query<{ key: string; value: string }>('SELECT key, value FROM agent_config WHERE override_service = $1 AND agent_id = $2 ORDER BY key', [SERVICE, a.uid]);
  return {
    org_id: a.org_id, group_id: a.group_id || null, name: a.name, status: a.status, contained: a.contained,
    config: Object.fromEntries(rows.map((r) => [r.key, { value: JSON.parse(r.value) }])),
  };
}

async function build(db: Queryable, enclave: { id: string; name: string; isolation_class: string }, orgIds: string[], agents: AgentRow[], version: string): Promise<Snapshot> {
  const orgs: Record<string, unknown> = {};
  for (const org of [...new Set(orgIds)].sort()) orgs[org] = await orgState(db, org);
  const agentStates: Record<string, unknown> = {};
  for (const a of agents) agentStates[a.uid] = await agentState(db, a);
  return validateSnapshot({ version, enclave, platform: await rowsOf(db, 'platform'), orgs, agents: agentStates });
}

interface EnclaveScope {
  enclave: { id: string; name: string; isolation_class: string };
  orgs: string[];
  agents: AgentRow[];
  version: string;
}

/** What an enclave serves: its owner's org and its agents' orgs (narrowed to `onlyOrg` when given), and its agents. */
async function enclaveScope(db: Queryable, enclaveId: string, onlyOrg?: string): Promise<EnclaveScope | null> {
  const { rows } = await db.query<{ id: string; name: string; isolation_class: string; owning_org_id: string }>('SELECT id, name, isolation_class, owning_org_id FROM enclaves WHERE id = $1', [enclaveId]);
  if (rows.length === 0) return null;
  const e = rows[0];
  const agents = (await db.query<AgentRow>('SELECT uid, org_id, group_id, name, status, contained FROM agents WHERE enclave_id = $1 ORDER BY uid', [enclaveId])).rows
    .filter((a) => !onlyOrg || a.org_id === onlyOrg);
  const cursor = (await db.query<{ max: string | number | null }>('SELECT max(id) AS max FROM events WHERE enclave_id = $1', [enclaveId])).rows[0]?.max ?? 0;
  const orgs = [e.owning_org_id, ...agents.map((a) => a.org_id)].filter((o) => !onlyOrg || o === onlyOrg);
  return { enclave: { id: e.id, name: e.name, isolation_class: e.isolation_class }, orgs: [...new Set(orgs)].sort(), agents, version: `${new Date().toISOString()}#${Number(cursor)}` };
}

/** The snapshot of one enclave; null if it does not exist. */
export async function enclaveSnapshot(db: Queryable, enclaveId: string, onlyOrg?: string): Promise<Snapshot | null> {
  const scope = await enclaveScope(db, enclaveId, onlyOrg);
  return scope && build(db, scope.enclave, scope.orgs, scope.agents, scope.version);
}

type ConfigRows = Record<string, { value: unknown; locked: boolean; secret: boolean }>;

/** Opens a value sealed under an org's data key (the control plane's crypto-shred); identity when unsealed. */
export type OpenValue = (org: string, value: string) => Promise<string>;
const plain: OpenValue = async (_org, value) => value;

async function configRows(db: Queryable, kind: string, org: string, group: string, agent: string, openValue: OpenValue = plain): Promise<ConfigRows> {
  const { rows } = await db.query<{ key: string; value: string | null; locked: boolean; secret: boolean }>(
    'SELECT key, value, locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 ORDER BY key', [kind, org, group, agent],
  );
  // A secret key carries no value: its bytes are authored enclave-side.
  const out: ConfigRows = {};
  for (const r of rows) out[r.key] = { value: r.secret || r.value === null ? null : JSON.parse(await openValue(org, r.value)), locked: r.locked, secret: r.secret };
  return out;
}

/**
 * The config values an enclave serves (`dvx config-pull`), scope by scope like the policy snapshot:
 * `{version, enclave, platform, orgs: {ORG: {config, groups: {G: {config}}}}, agents: {UID: {org_id, group_id, config}}}`.
 */
export async function enclaveConfig(db: Queryable, enclaveId: string, onlyOrg?: string, openValue: OpenValue = plain): Promise<Record<string, unknown> | null> {
  const scope = await enclaveScope(db, enclaveId, onlyOrg);
  if (!scope) return null;
  const orgs: Record<string, unknown> = {};
  for (const org of scope.orgs) {
    const groupIds = (await db.query<{ group_id: string }>(`SELECT DISTINCT group_id FROM config_values WHERE scope_kind = 'group' AND org_id = $1 ORDER BY group_id`, [org])).rows;
    const groups: Record<string, unknown> = {};
    for (const g of groupIds) groups[g.group_id] = { config: await configRows(db, 'group', org, g.group_id, '', openValue) };
    orgs[org] = { config: await configRows(db, 'org', org, '', '', openValue), groups };
  }
  const agents: Record<string, unknown> = {};
  for (const a of scope.agents) agents[a.uid] = { org_id: a.org_id, group_id: a.group_id || null, config: await configRows(db, 'agent', a.org_id, '', a.uid, openValue) };
  return { version: scope.version, enclave: { id: scope.enclave.id, name: scope.enclave.name }, platform: await configRows(db, 'platform', '', '', ''), orgs, agents };
}

/** Every org and every agent, for a proxy that serves no particular enclave (llmproxy --database-dsn without --enclave-id). */
export async function wholeSnapshot(db: Queryable): Promise<Snapshot> {
  const orgs = (await db.query<{ id: string }>('SELECT id FROM orgs ORDER BY id')).rows.map((r) => r.id);
  const agents = (await db.query<AgentRow>('SELECT uid, org_id, group_id, name, status, contained FROM agents ORDER BY uid')).rows;
  const cursor = (await db.query<{ max: string | number | null }>('SELECT max(id) AS max FROM events')).rows[0]?.max ?? 0;
  return build(db, { id: '', name: '', isolation_class: 'plain' }, orgs, agents, `${new Date().toISOString()}#${Number(cursor)}`);
}

/** The state one agent of an org is resolved against (its enclave aside): for the effective-policy read. */
export async function agentSnapshot(db: Queryable, org: string, agent: AgentRow): Promise<Snapshot> {
  return build(db, { id: '', name: '', isolation_class: 'plain' }, [org], [agent], 'effective');
}
