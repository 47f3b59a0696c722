import type { Queryable } from '../../core/sql.ts';

// Per-org erasures in the store (spec: erasureView, erasureResultView): one row per erased org, kept
// for good (an erased org's id is never reused).

export interface ErasureRow {
  org_id: string;
  status: string;
  key_shredded: boolean;
  rows_swept: string | number;
}

export async function getErasure(db: Queryable, org: string): Promise<ErasureRow | undefined> {
  return (await db.query<ErasureRow>('SELECT * FROM erasures WHERE org_id = $1', [org])).rows[0];
}

export async function startErasure(tx: Queryable, org: string, requestedBy: string): Promise<void> {
  await tx.query(`INSERT INTO erasures (org_id, status, requested_by) VALUES ($1, 'running', $2)`, [org, requestedBy]);
}

export async function recordKeyShredded(db: Queryable, org: string, shredded: boolean): Promise<void> {
  await db.query('UPDATE erasures SET key_shredded = $2 WHERE org_id = $1', [org, shredded]);
}

export async function completeErasure(db: Queryable, org: string, swept: number): Promise<void> {
  await db.query(
    `UPDATE erasures SET status = 'complete', rows_swept = rows_swept + $2, completed_at = now() WHERE org_id = $1`,
    [org, swept],
  );
}

/** The orgs whose erasure has not completed, oldest request first. */
export async function runningErasures(db: Queryable): Promise<string[]> {
  return (
    await db.query<{ org_id: string }>(`SELECT org_id FROM erasures WHERE status = 'running' ORDER BY requested_at`)
  ).rows.map((r) => r.org_id);
}

// Tables holding an org's rows, with the column naming the org (children before parents).
const ORG_TABLES: [string, string][] = [
  ['events', `enclave_id IN (SELECT id FROM enclaves WHERE owning_org_id = $1)`],
  ['pack_installs', 'org_id = $1'],
  ['governance_policy', 'org_id = $1'],
  ['config_values', 'org_id = $1'],
  ['service_config', 'org_id = $1'],
  ['agent_config', 'org_id = $1'],
  ['feature_flags', 'org_id = $1'],
  ['idp_connectors', 'org_id = $1'],
  ['service_account_keys', 'account_id IN (SELECT id FROM service_accounts WHERE org_id = $1)'],
  ['service_accounts', 'org_id = $1'],
  ['grants', 'org_id = $1'],
  ['memberships', 'org_id = $1'],
  ['members', 'org_id = $1'],
  ['agents', 'org_id = $1'],
  ['enclaves', 'owning_org_id = $1'],
  ['org_groups', 'org_id = $1'],
  ['roles', 'org_id = $1'],
  ['orgs', 'id = $1'],
];

/** Deletes every row of the org from the control plane's store (run in one transaction); the number deleted. */
export async function sweepOrgRows(tx: Queryable, org: string): Promise<number> {
  let n = 0;
  for (const [table, where] of ORG_TABLES) {
    const { rows } = await tx.query<{ n: number }>(
      `WITH gone AS (DELETE FROM ${table} WHERE ${where} RETURNING 1) SELECT count(*)::int AS n FROM gone`,
      [org],
    );
    n += Number(rows[0].n);
  }
  return n;
}
