import type { Queryable } from '../../core/sql.ts';

// Governance policy rows in the store (spec: Governance policies), one per kind and scope. A scope is
// given as its row key [scope_kind, org_id, group_id, agent_id] (scope-query.ts, rowKey).

export type RowKey = [string, string, string, string];

export async function getPolicy(
  db: Queryable,
  kind: string,
  at: RowKey,
): Promise<{ value: string; locked: boolean } | undefined> {
  return (
    await db.query<{ value: string; locked: boolean }>(
      'SELECT value, locked FROM governance_policy WHERE kind = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND agent_id = $5',
      [kind, ...at],
    )
  ).rows[0];
}

export async function policyLocked(tx: Queryable, kind: string, at: RowKey): Promise<boolean> {
  const { rows } = await tx.query<{ locked: boolean }>(
    'SELECT locked FROM governance_policy WHERE kind = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND agent_id = $5',
    [kind, ...at],
  );
  return rows[0]?.locked === true;
}

export async function upsertPolicy(
  tx: Queryable,
  kind: string,
  at: RowKey,
  p: { value: string; locked: boolean },
  updatedBy: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO governance_policy (kind, scope_kind, org_id, group_id, agent_id, value, locked, updated_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (kind, scope_kind, org_id, group_id, agent_id) DO UPDATE SET value = EXCLUDED.value, locked = EXCLUDED.locked, updated_by = EXCLUDED.updated_by, updated_at = now()`,
    [kind, ...at, p.value, p.locked, updatedBy],
  );
}

/** False when there was no such policy. */
export async function deletePolicy(tx: Queryable, kind: string, at: RowKey): Promise<boolean> {
  const { rows } = await tx.query(
    'DELETE FROM governance_policy WHERE kind = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND agent_id = $5 RETURNING kind',
    [kind, ...at],
  );
  return rows.length > 0;
}

/** Every policy row at one scope. */
export async function policiesAt<K extends string>(
  db: Queryable,
  at: RowKey,
): Promise<{ kind: K; value: string; locked: boolean }[]> {
  return (
    await db.query<{ kind: K; value: string; locked: boolean }>(
      'SELECT kind, value, locked FROM governance_policy WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4',
      at,
    )
  ).rows;
}
