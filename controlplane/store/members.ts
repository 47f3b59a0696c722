import type { Queryable } from '../../core/sql.ts';

// An org's members and their group memberships in the store (spec: memberView).

export interface MemberView {
  subject: string;
  username: string;
  email: string;
}

/** One round trip: the org (a row with a null subject when it has no members; none when no org) and its members. */
export const MEMBERS_OF_ORG =
  'SELECT o.id AS org, m.subject, m.username, m.email FROM orgs o LEFT JOIN members m ON m.org_id = o.id WHERE o.id = $1 ORDER BY m.subject';

/** The org's members; undefined when there is no such org. */
export async function membersOfOrg(db: Queryable, org: string): Promise<MemberView[] | undefined> {
  const { rows } = await db.query<MemberView & { org: string }>(MEMBERS_OF_ORG, [org]);
  if (rows.length === 0) return undefined;
  return rows.filter((r) => r.subject !== null).map(({ subject, username, email }) => ({ subject, username, email }));
}

export async function upsertMember(
  tx: Queryable,
  org: string,
  member: MemberView,
  createdBy: string,
): Promise<MemberView> {
  const { rows } = await tx.query<MemberView>(
    `INSERT INTO members (org_id, subject, username, email, created_by) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (org_id, subject) DO UPDATE SET username = EXCLUDED.username, email = EXCLUDED.email
     RETURNING subject, username, email`,
    [org, member.subject, member.username, member.email, createdBy],
  );
  return rows[0];
}

export async function memberExists(db: Queryable, org: string, subject: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM members WHERE org_id = $1 AND subject = $2', [org, subject])).rows.length > 0;
}

export async function addMembership(tx: Queryable, org: string, group: string, subject: string): Promise<void> {
  await tx.query('INSERT INTO memberships (org_id, group_id, subject) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING', [
    org,
    group,
    subject,
  ]);
}

/** False when the subject was not in the group. */
export async function removeMembership(tx: Queryable, org: string, group: string, subject: string): Promise<boolean> {
  const { rows } = await tx.query(
    'DELETE FROM memberships WHERE org_id = $1 AND group_id = $2 AND subject = $3 RETURNING subject',
    [org, group, subject],
  );
  return rows.length > 0;
}

/** Offboarding: the member, their group memberships and every grant to them in the org; false when not a member. */
export async function offboardMember(tx: Queryable, org: string, subject: string): Promise<boolean> {
  const { rows } = await tx.query('DELETE FROM members WHERE org_id = $1 AND subject = $2 RETURNING subject', [
    org,
    subject,
  ]);
  if (rows.length === 0) return false;
  await tx.query('DELETE FROM memberships WHERE org_id = $1 AND subject = $2', [org, subject]);
  await tx.query('DELETE FROM grants WHERE org_id = $1 AND principal = $2', [org, `user:${subject}`]);
  return true;
}

/** A member by subject and username, unless the subject is a member already. */
export async function addMemberOnce(
  tx: Queryable,
  org: string,
  subject: string,
  username: string,
  createdBy: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO members (org_id, subject, username, created_by) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
    [org, subject, username, createdBy],
  );
}
