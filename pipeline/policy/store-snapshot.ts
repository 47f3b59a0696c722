import { PolicyValidationError } from '../errors.ts';
import {
  SETTING_KEYS,
  snapshotDocument,
  validateConfigRow,
  validatePacks,
  validateSnapshot,
  type SnapshotPack,
  type Snapshot,
} from './snapshot.ts';
import type { PolicyRow } from './resolve.ts';
import type { PackRules } from './governance.ts';
import type { Queryable } from '../../core/sql.ts';

// The snapshot an enclave converges on (docs/snapshot.md), built from the store: the platform's
// llmproxy rows and governance policies, every org the enclave serves (its owner and the orgs of the
// agents it runs) with their rows, groups, flags and packs, and the agents it runs. The result goes through the proxy's own
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

/**
 * Parses and validates one stored row; a row that does not is recorded in `skipped` and left out. A
 * settings table holds the settings only: a governance key there (by hand) is refused like any unknown key.
 */
function storedRow(
  skipped: SkippedRow[],
  scope: string,
  key: string,
  text: string,
  locked: boolean,
  lockable: boolean,
  setting = true,
): PolicyRow<unknown> | null {
  try {
    if (setting && !(SETTING_KEYS as readonly string[]).includes(key))
      throw new PolicyValidationError(`${scope}.${key}`, `unknown llmproxy key (one of ${SETTING_KEYS.join(', ')})`);
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
  await governanceRows(db, skipped, out, name, [scope, org, group, '']);
  return out;
}

/**
 * The governance policies stored at one scope (controlplane/store/governance-policies.ts), as rows
 * `KIND_policy` added to `out`; validated like every other row (a lock at agent scope is refused).
 */
async function governanceRows(
  db: Queryable,
  skipped: SkippedRow[],
  out: Rows,
  name: string,
  at: [string, string, string, string],
): Promise<void> {
  const agent = at[0] === 'agent';
  const { rows } = await db.query<{ kind: string; value: string; locked: boolean }>(
    agent
      ? `SELECT kind, value, locked FROM governance_policy WHERE scope_kind = 'agent' AND agent_id = $1 ORDER BY kind`
      : 'SELECT kind, value, locked FROM governance_policy WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 ORDER BY kind',
    agent ? [at[3]] : at,
  );
  for (const r of rows) {
    const key = `${r.kind}_policy`;
    const row = storedRow(skipped, name, key, r.value, r.locked, !agent, false);
    if (row) out[key] = row;
  }
}

/**
 * Pack definitions, each validated once per build: one that does not validate is skipped whole (a
 * pack is one authored unit: its LLM policy and its destination rules) and named once.
 */
class PackDefinitions {
  #db: Queryable;
  #skipped: SkippedRow[];
  #seen = new Map<string, SnapshotPack | null>();
  constructor(db: Queryable, skipped: SkippedRow[]) {
    this.#db = db;
    this.#skipped = skipped;
  }

  /** The valid packs installed where `where` says (`$1`, `$2`: its parameters), most general scope first. */
  async installed(where: string, params: unknown[]): Promise<SnapshotPack[]> {
    const { rows } = await this.#db.query<{ name: string; allow: string; deny: string; config: string }>(
      `SELECT p.name, p.allow, p.deny, p.config FROM pack_installs i JOIN policy_packs p ON p.name = i.pack WHERE (${where})
        GROUP BY p.name, p.allow, p.deny, p.config
        ORDER BY min(CASE i.scope_kind WHEN 'platform' THEN 0 WHEN 'org' THEN 1 WHEN 'group' THEN 2 ELSE 3 END), p.name`,
      params,
    );
    const out: SnapshotPack[] = [];
    for (const r of rows) {
      if (!this.#seen.has(r.name)) {
        try {
          const doc = {
            name: r.name,
            config: JSON.parse(r.config),
            allow: JSON.parse(r.allow),
            deny: JSON.parse(r.deny),
          };
          this.#seen.set(r.name, validatePacks([doc], `pack:${r.name}`)[0]);
        } catch (err) {
          if (!(err instanceof PolicyValidationError) && !(err instanceof SyntaxError)) throw err;
          this.#seen.set(r.name, null);
          this.#skipped.push({ scope: `pack:${r.name}`, key: 'definition', reason: err.message });
        }
      }
      const pack = this.#seen.get(r.name);
      if (pack) out.push(pack);
    }
    return out;
  }
}

const rulesOf = (packs: SnapshotPack[]): PackRules[] =>
  packs.map((p) => ({ name: p.name, allow: p.allow, deny: p.deny }));

async function orgState(db: Queryable, skipped: SkippedRow[], packDefs: PackDefinitions, org: string) {
  const flags = (
    await db.query<{ flag: string; enabled: boolean }>('SELECT flag, enabled FROM feature_flags WHERE org_id = $1', [
      org,
    ])
  ).rows;
  // Every group with anything at its scope: settings, governance policies or packs.
  const groupIds = (
    await db.query<{ group_id: string }>(
      `SELECT group_id FROM service_config WHERE service = $1 AND scope_kind = 'group' AND org_id = $2
       UNION SELECT group_id FROM governance_policy WHERE scope_kind = 'group' AND org_id = $2
       UNION SELECT group_id FROM pack_installs WHERE scope_kind = 'group' AND org_id = $2
       ORDER BY group_id`,
      [SERVICE, org],
    )
  ).rows.map((r) => r.group_id);
  const groups: Record<string, { config: Rows; packs: PackRules[] }> = {};
  for (const g of groupIds)
    groups[g] = {
      config: await rowsOf(db, skipped, 'group', org, g),
      packs: rulesOf(
        await packDefs.installed(`i.scope_kind = 'group' AND i.org_id = $1 AND i.group_id = $2`, [org, g]),
      ),
    };
  // Packs installed at platform scope or at this org's: their LLM policy and their destination rules.
  const packs = await packDefs.installed(`i.scope_kind = 'platform' OR (i.scope_kind = 'org' AND i.org_id = $1)`, [
    org,
  ]);
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

async function agentState(db: Queryable, skipped: SkippedRow[], packDefs: PackDefinitions, a: AgentRow) {
  const { rows } = await db.query<{ key: string; value: string }>(
    'SELECT key, value FROM agent_config WHERE override_service = $1 AND agent_id = $2 ORDER BY key',
    [SERVICE, a.uid],
  );
  const config: Rows = {};
  for (const r of rows) {
    const row = storedRow(skipped, `agent:${a.uid}`, r.key, r.value, false, false);
    if (row) config[r.key] = row;
  }
  await governanceRows(db, skipped, config, `agent:${a.uid}`, ['agent', a.org_id, '', a.uid]);
  return {
    org_id: a.org_id,
    group_id: a.group_id || null,
    name: a.name,
    status: a.status,
    contained: a.contained,
    config,
    // The agent's own packs (its policy_packs, installed at its scope).
    packs: rulesOf(await packDefs.installed(`i.scope_kind = 'agent' AND i.agent_id = $1`, [a.uid])),
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
  const packDefs = new PackDefinitions(db, skipped);
  const orgs: Record<string, unknown> = {};
  for (const org of [...new Set(orgIds)].sort()) orgs[org] = await orgState(db, skipped, packDefs, org);
  const agentStates: Record<string, unknown> = {};
  for (const a of agents) agentStates[a.uid] = await agentState(db, skipped, packDefs, a);
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
