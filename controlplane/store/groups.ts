import type { Queryable } from '../../core/sql.ts';

// An org's groups in the store (spec: groupView).

export interface GroupView {
  id: string;
  name: string;
  org_id: string;
  provider_group_ref: string;
}

const GROUP_COLUMNS = 'id, name, org_id, provider_group_ref';

export async function groupExists(db: Queryable, org: string, group: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM org_groups WHERE org_id = $1 AND id = $2', [org, group])).rows.length > 0;
}

export async function listGroups(db: Queryable, org: string): Promise<GroupView[]> {
  return (await db.query<GroupView>(`SELECT ${GROUP_COLUMNS} FROM org_groups WHERE org_id = $1 ORDER BY id`, [org]))
    .rows;
}

export async function insertGroup(
  db: Queryable,
  org: string,
  group: { id: string; name: string; ref: string },
  createdBy: string,
): Promise<GroupView> {
  const { rows } = await db.query<GroupView>(
    `INSERT INTO org_groups (org_id, id, name, provider_group_ref, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING ${GROUP_COLUMNS}`,
    [org, group.id, group.name, group.ref, createdBy],
  );
  return rows[0];
}

/** Deletes the group with the grants to and within it and its memberships; false when there is none. */
export async function deleteGroup(tx: Queryable, org: string, group: string): Promise<boolean> {
  const { rows } = await tx.query('DELETE FROM org_groups WHERE org_id = $1 AND id = $2 RETURNING id', [org, group]);
  if (rows.length === 0) return false;
  await tx.query('DELETE FROM grants WHERE principal = $1 OR (org_id = $2 AND group_id = $3)', [
    `group:${org}:${group}`,
    org,
    group,
  ]);
  await tx.query('DELETE FROM memberships WHERE org_id = $1 AND group_id = $2', [org, group]);
  return true;
}

/** The ids of an org's groups. */
export async function groupIdsOf(db: Queryable, org: string): Promise<string[]> {
  return (await db.query<{ id: string }>('SELECT id FROM org_groups WHERE org_id = $1', [org])).rows.map((r) => r.id);
}
