import type { Queryable } from '../../core/sql.ts';

// An org's feature flags (feature_flags), for routes/feature-flags.ts; a flag never set has no row.

/** The flags set for `org`, by name. */
export async function orgFlags(db: Queryable, org: string): Promise<Map<string, boolean>> {
  const { rows } = await db.query<{ flag: string; enabled: boolean }>(
    'SELECT flag, enabled FROM feature_flags WHERE org_id = $1',
    [org],
  );
  return new Map(rows.map((r) => [r.flag, r.enabled]));
}

export async function putFlag(tx: Queryable, org: string, flag: string, enabled: boolean, by: string): Promise<void> {
  await tx.query(
    `INSERT INTO feature_flags (org_id, flag, enabled, updated_by) VALUES ($1, $2, $3, $4)
     ON CONFLICT (org_id, flag) DO UPDATE
       SET enabled = EXCLUDED.enabled, updated_by = EXCLUDED.updated_by, updated_at = now()`,
    [org, flag, enabled, by],
  );
}
