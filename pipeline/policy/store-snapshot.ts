import { PolicyValidationError } from '../errors.ts';
import { snapshotDocument, validateConfigRow, validatePacks, validateSnapshot, type Snapshot } from './snapshot.ts';
import type { PolicyPack, PolicyRow } from './resolve.ts';
import type { Queryable } from '../../core/sql.ts';

// The snapshot an enclave converges on (docs/snapshot.md), built from the store: the platform's
// llmproxy rows, every org the enclave serves (its owner and the orgs of the agents it runs) with
// their rows, groups and flags, and the agents it runs. The result goes through the proxy's own
// validator, so what an enclave receives is exactly what its llmproxy accepts. The same builder serves
// the operator's "effective policy" read, so the API shows what the proxy enforces.

const SERVICE = 'llmproxy';

/** The PostgreSQL NOTIFY channel the control plane signals on every committed change of this state. */
export const CHANGES_CHANNEL = 'dvx_events';

type Rows = Record<string, PolicyRow<unknown>>;

/**
 * A stored row the builder left out because it does not validate (written by an older release, or
 * by hand in the store). One bad row must not stop policy distribution for every enclave that
 * carries its scope: it is skipped, named here (and in the served document as `skipped`), and the
 * caller logs and counts it. `scope` is `platform`, `org:O`, `group:O:G`, `agent:A` or `pack:NAME`.
 */
export interface SkippedRow {
  scope: string;
  key: string;
  reason: string;
}

/** A snapshot built from the store, with the rows it skipped. */
export interface StoreSnapshot extends Snapshot {
  skipped: SkippedRow[];
}

/** Parses and validates one stored row; a row that does not is recorded in `skipped` and left out. */
function storedRow(
  skipped: SkippedRow[],
  scope: string,
  key: string,
  text: string,
  locked: boolean,
  lockable: boolean,
): PolicyRow<unknown> | null {
  try {
    return validateConfigRow(
      key,
      { value: JSON.parse(text), ...(lockable || locked ? { locked } : {}) },
      `${scope}.${key}`,
      lockable,
    );
  } catch (err) {
    if (!(err instanceof PolicyValidationError) && !(err instanceof SyntaxError)) throw err;
    skipped.push({ scope, key, reason: err.message });
    return null;
  }
}

async function rowsOf(
  db: Queryable,
  skipped: SkippedRow[],
  scope: 'platform' | 'org' | 'group',
  org = '',
  group = '',
): Promise<Rows> {
  const { rows } = await db.query<{ key: string; value: string; locked: boolean }>(
    'SELECT key, value, locked FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 ORDER BY key',
    [SERVICE, scope, org, group],
  );
  const name = scope === 'platform' ? 'platform' : scope === 'org' ? `org:${org}` : `group:${org}:${group}`;
  const out: Rows = {};
  for (const r of rows) {
    const row = storedRow(skipped, name, r.key, r.value, r.locked, true);
    if (row) out[r.key] = row;
  }
  return out;
}

async function orgState(db: Queryable, skipped: SkippedRow[], org: string) {
  const flags = (
    await db.query<{ flag: string; enabled: boolean }>('SELECT flag, enabled FROM feature_flags WHERE org_id = $1', [
      org,
    ])
  ).rows;
  const groupIds = (
    await db.query<{ group_id: string }>(
      `SELECT DISTINCT group_id FROM service_config WHERE service = $1 AND scope_kind = 'group' AND org_id = $2 ORDER BY group_id`,
      [SERVICE, org],
    )
  ).rows.map((r) => r.group_id);
  const groups: Record<string, { config: Rows }> = {};
  for (const g of groupIds) groups[g] = { config: await rowsOf(db, skipped, 'group', org, g) };
  // Packs carrying LLM policy, installed at platform scope or at this org's scope; one that does not
  // validate is skipped whole (a pack is one authored unit).
  const packs: PolicyPack[] = [];
  const { rows } = await db.query<{ name: string; config: string }>(
    `SELECT DISTINCT p.name, p.config FROM pack_installs i JOIN policy_packs p ON p.name = i.pack
      WHERE p.config <> '{}' AND (i.scope_kind = 'platform' OR (i.scope_kind = 'org' AND i.org_id = $1)) ORDER BY p.name`,
    [org],
  );
  for (const r of rows) {
    try {
      packs.push(...validatePacks([{ name: r.name, config: JSON.parse(r.config) }], `pack:${r.name}`));
    } catch (err) {
      if (!(err instanceof PolicyValidationError) && !(err instanceof SyntaxError)) throw err;
      if (!skipped.some((s) => s.scope === `pack:${r.name}`))
        skipped.push({ scope: `pack:${r.name}`, key: 'config', reason: err.message });
    }
  }
  return {
    config: await rowsOf(db, skipped, 'org', org),
    flags: Object.fromEntries(flags.map((f) => [f.flag, f.enabled])),
    groups,
    packs,
  };
}

interface AgentRow {
  uid: string;
  org_id: string;
  group_id: string;
  name: string;
  status: string;
  contained: boolean;
}

async function agentState(db: Queryable, skipped: SkippedRow[], a: AgentRow) {
  const { rows } = await db.query<{ key: string; value: string }>(
    'SELECT key, value FROM agent_config WHERE override_service = $1 AND agent_id = $2 ORDER BY key',
    [SERVICE, a.uid],
  );
  const config: Rows = {};
  for (const r of rows) {
    const row = storedRow(skipped, `agent:${a.uid}`, r.key, r.value, false, false);
    if (row) config[r.key] = row;
  }
  return {
    org_id: a.org_id,
    group_id: a.group_id || null,
    name: a.name,
    status: a.status,
    contained: a.contained,
    config,
  };
}

async function build(
  db: Queryable,
  enclave: { id: string; name: string; isolation_class: string },
  orgIds: string[],
  agents: AgentRow[],
  version: string,
): Promise<StoreSnapshot> {
  const skipped: SkippedRow[] = [];
  const orgs: Record<string, unknown> = {};
  for (const org of [...new Set(orgIds)].sort()) orgs[org] = await orgState(db, skipped, org);
  const agentStates: Record<string, unknown> = {};
  for (const a of agents) agentStates[a.uid] = await agentState(db, skipped, a);
  const platform = await rowsOf(db, skipped, 'platform');
  // Every row is validated already; the whole goes through the proxy's own validator once more in its
  // wire form, so what an enclave receives is exactly what its llmproxy accepts.
  const snapshot = validateSnapshot(
    snapshotDocument({ version, enclave, platform, orgs, agents: agentStates } as Snapshot),
  );
  return { ...snapshot, skipped };
}

/**
 * The document served to an enclave (`GET /v1/broker/snapshot`, `--policy-publish`): the snapshot, and the rows it
 * skipped.
 */
export function storeSnapshotDocument(s: StoreSnapshot): Record<string, unknown> {
  return { ...snapshotDocument(s), skipped: s.skipped };
}

interface EnclaveScope {
  enclave: { id: string; name: string; isolation_class: string };
  orgs: string[];
  agents: AgentRow[];
  version: string;
}

/** What an enclave serves: its owner's org and its agents' orgs (narrowed to `onlyOrg` when given), and its agents. */
async function enclaveScope(db: Queryable, enclaveId: string, onlyOrg?: string): Promise<EnclaveScope | null> {
  const { rows } = await db.query<{ id: string; name: string; isolation_class: string; owning_org_id: string }>(
    'SELECT id, name, isolation_class, owning_org_id FROM enclaves WHERE id = $1',
    [enclaveId],
  );
  if (rows.length === 0) return null;
  const e = rows[0];
  const agents = (
    await db.query<AgentRow>(
      'SELECT uid, org_id, group_id, name, status, contained FROM agents WHERE enclave_id = $1 ORDER BY uid',
      [enclaveId],
    )
  ).rows.filter((a) => !onlyOrg || a.org_id === onlyOrg);
  const cursor =
    (
      await db.query<{ max: string | number | null }>('SELECT max(id) AS max FROM events WHERE enclave_id = $1', [
        enclaveId,
      ])
    ).rows[0]?.max ?? 0;
  const orgs = [e.owning_org_id, ...agents.map((a) => a.org_id)].filter((o) => !onlyOrg || o === onlyOrg);
  return {
    enclave: { id: e.id, name: e.name, isolation_class: e.isolation_class },
    orgs: [...new Set(orgs)].sort(),
    agents,
    version: `${new Date().toISOString()}#${Number(cursor)}`,
  };
}

/** The snapshot of one enclave; null if it does not exist. */
export async function enclaveSnapshot(
  db: Queryable,
  enclaveId: string,
  onlyOrg?: string,
): Promise<StoreSnapshot | null> {
  const scope = await enclaveScope(db, enclaveId, onlyOrg);
  return scope && build(db, scope.enclave, scope.orgs, scope.agents, scope.version);
}

type ConfigRows = Record<string, { value: unknown; locked: boolean; secret: boolean }>;

/** Opens a value sealed under an org's data key (the control plane's crypto-shred); identity when unsealed. */
export type OpenValue = (org: string, value: string) => Promise<string>;
const plain: OpenValue = async (_org, value) => value;

async function configRows(
  db: Queryable,
  kind: string,
  org: string,
  group: string,
  agent: string,
  openValue: OpenValue = plain,
): Promise<ConfigRows> {
  const { rows } = await db.query<{ key: string; value: string | null; locked: boolean; secret: boolean }>(
    'SELECT key, value, locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 ORDER BY key',
    [kind, org, group, agent],
  );
  // A secret key carries no value: its bytes are authored enclave-side.
  const out: ConfigRows = {};
  for (const r of rows)
    out[r.key] = {
      value: r.secret || r.value === null ? null : JSON.parse(await openValue(org, r.value)),
      locked: r.locked,
      secret: r.secret,
    };
  return out;
}

/**
 * The config values an enclave serves (`dvx config-pull`), scope by scope like the policy snapshot:
 * {version, enclave, platform, orgs: {ORG: {config, groups: {G: {config}}}}, agents: {UID: {org_id, group_id, config}}}
 */
export async function enclaveConfig(
  db: Queryable,
  enclaveId: string,
  onlyOrg?: string,
  openValue: OpenValue = plain,
): Promise<Record<string, unknown> | null> {
  const scope = await enclaveScope(db, enclaveId, onlyOrg);
  if (!scope) return null;
  const orgs: Record<string, unknown> = {};
  for (const org of scope.orgs) {
    const groupIds = (
      await db.query<{ group_id: string }>(
        `SELECT DISTINCT group_id FROM config_values WHERE scope_kind = 'group' AND org_id = $1 ORDER BY group_id`,
        [org],
      )
    ).rows;
    const groups: Record<string, unknown> = {};
    for (const g of groupIds)
      groups[g.group_id] = { config: await configRows(db, 'group', org, g.group_id, '', openValue) };
    orgs[org] = { config: await configRows(db, 'org', org, '', '', openValue), groups };
  }
  const agents: Record<string, unknown> = {};
  for (const a of scope.agents)
    agents[a.uid] = {
      org_id: a.org_id,
      group_id: a.group_id || null,
      config: await configRows(db, 'agent', a.org_id, '', a.uid, openValue),
    };
  return {
    version: scope.version,
    enclave: { id: scope.enclave.id, name: scope.enclave.name },
    platform: await configRows(db, 'platform', '', '', ''),
    orgs,
    agents,
  };
}

/**
 * Every org and every agent, for a proxy that serves no particular enclave (llmproxy --database-dsn without
 * --enclave-id).
 */
export async function wholeSnapshot(db: Queryable): Promise<StoreSnapshot> {
  const orgs = (await db.query<{ id: string }>('SELECT id FROM orgs ORDER BY id')).rows.map((r) => r.id);
  const agents = (
    await db.query<AgentRow>('SELECT uid, org_id, group_id, name, status, contained FROM agents ORDER BY uid')
  ).rows;
  const cursor =
    (await db.query<{ max: string | number | null }>('SELECT max(id) AS max FROM events')).rows[0]?.max ?? 0;
  return build(
    db,
    { id: '', name: '', isolation_class: 'plain' },
    orgs,
    agents,
    `${new Date().toISOString()}#${Number(cursor)}`,
  );
}

/** The state one agent of an org is resolved against (its enclave aside): for the effective-policy read. */
export async function agentSnapshot(db: Queryable, org: string, agent: AgentRow): Promise<StoreSnapshot> {
  return build(db, { id: '', name: '', isolation_class: 'plain' }, [org], [agent], 'effective');
}
