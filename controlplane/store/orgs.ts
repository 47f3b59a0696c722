import type { Queryable } from '../../core/sql.ts';

// Orgs in the store (spec: orgView). Plain functions over a Queryable: the pool, or the transaction
// client of an audited change (docs/decisions.md, "Control-plane store modules and plugins").

export interface OrgView {
  id: string;
  kind: string;
  name: string;
  provider_org_ref: string;
  status: string;
}

const ORG_COLUMNS = 'id, kind, name, provider_org_ref, status';

export async function orgExists(db: Queryable, org: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM orgs WHERE id = $1', [org])).rows.length > 0;
}

/** An erased org's id is never reused: its data key is gone for good. */
export async function orgWasErased(db: Queryable, org: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM erasures WHERE org_id = $1', [org])).rows.length > 0;
}

export async function listOrgs(db: Queryable): Promise<OrgView[]> {
  return (await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs ORDER BY id`)).rows;
}

export async function getOrg(db: Queryable, org: string): Promise<OrgView | undefined> {
  return (await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs WHERE id = $1`, [org])).rows[0];
}

export async function insertOrg(
  db: Queryable,
  org: { id: string; name: string; ref: string; status: string },
  createdBy: string,
): Promise<OrgView> {
  const { rows } = await db.query<OrgView>(
    `INSERT INTO orgs (id, name, provider_org_ref, status, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING ${ORG_COLUMNS}`,
    [org.id, org.name, org.ref, org.status, createdBy],
  );
  return rows[0];
}

/** Changes the fields given (null keeps a field); undefined when there is no such org. */
export async function updateOrg(
  db: Queryable,
  org: string,
  change: { name: string | null; ref: string | null; status: string | null },
): Promise<OrgView | undefined> {
  const { rows } = await db.query<OrgView>(
    `UPDATE orgs SET name = coalesce($2, name), provider_org_ref = coalesce($3, provider_org_ref), status = coalesce($4, status) WHERE id = $1 RETURNING ${ORG_COLUMNS}`,
    [org, change.name, change.ref, change.status],
  );
  return rows[0];
}

/** Deletes the org with its grants and memberships; false when there is no such org. */
export async function deleteOrg(tx: Queryable, org: string): Promise<boolean> {
  const { rows } = await tx.query('DELETE FROM orgs WHERE id = $1 RETURNING id', [org]);
  if (rows.length === 0) return false;
  await tx.query('DELETE FROM grants WHERE org_id = $1', [org]);
  await tx.query('DELETE FROM memberships WHERE org_id = $1', [org]);
  return true;
}
