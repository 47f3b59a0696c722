import type { Queryable } from '../../core/sql.ts';
import type { RowKey } from './governance-policies.ts';

// Config values in the store (spec: Config values), one per key and scope; a scope is given as its row
// key [scope_kind, org_id, group_id, agent_id] (scope-query.ts, rowKey). A stored value is JSON text,
// sealed under the org's data key where the control plane has a KMS; a secret key stores no value.

export interface ConfigValueRow {
  key: string;
  value: string | null;
  locked: boolean;
  secret: boolean;
}

type Flags = { locked: boolean; secret: boolean };

/** How `key` is set at one scope; undefined when it is not. */
export async function configFlags(tx: Queryable, at: RowKey, key: string): Promise<Flags | undefined> {
  const sql =
    'SELECT locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 AND key = $5';
  return (await tx.query<Flags>(sql, [...at, key])).rows[0];
}

export async function configValuesAt(db: Queryable, at: RowKey): Promise<ConfigValueRow[]> {
  return (
    await db.query<ConfigValueRow>(
      'SELECT key, value, locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 ORDER BY key',
      at,
    )
  ).rows;
}

export async function upsertConfigValue(
  tx: Queryable,
  at: RowKey,
  row: ConfigValueRow,
  updatedBy: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO config_values (scope_kind, org_id, group_id, agent_id, key, value, locked, secret, updated_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (scope_kind, org_id, group_id, agent_id, key) DO UPDATE SET value = EXCLUDED.value, locked = EXCLUDED.locked, secret = EXCLUDED.secret, updated_by = EXCLUDED.updated_by, updated_at = now()`,
    [...at, row.key, row.value, row.locked, row.secret, updatedBy],
  );
}

/** False when `key` was not set at the scope. */
export async function deleteConfigValue(tx: Queryable, at: RowKey, key: string): Promise<boolean> {
  const { rows } = await tx.query(
    'DELETE FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 AND key = $5 RETURNING key',
    [...at, key],
  );
  return rows.length > 0;
}
