import type { Queryable } from '../../core/sql.ts';

export async function orgExists(db: Queryable, org: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM orgs WHERE id = $1', [org])).rows.length > 0;
}
