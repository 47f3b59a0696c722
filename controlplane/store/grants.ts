import type { Queryable } from '../../core/sql.ts';
import type { ScopeKind } from '../authz/capabilities.ts';

// Grants in the store (spec: grantView): platform-scope ones, and an org's.

export interface GrantRow {
  id: string | number;
  principal: string;
  role: string | null;
  capability: string | null;
  scope_kind: ScopeKind;
  org_id: string;
  group_id: string;
  agent_id: string;
}

/** Where the grants live: at platform scope, or in one org. */
export type GrantScope = { kind: 'platform' } | { kind: 'org'; org: string };

const COLUMNS = 'id, principal, role, capability, scope_kind, org_id, group_id, agent_id';

const scopeSql = (s: GrantScope) =>
  (s.kind === 'platform' ? ["scope_kind = 'platform'", []] : ['org_id = $1', [s.org]]) as [string, string[]];

export async function listGrants(db: Queryable, scope: GrantScope): Promise<GrantRow[]> {
  const [where, params] = scopeSql(scope);
  return (await db.query<GrantRow>(`SELECT ${COLUMNS} FROM grants WHERE ${where} ORDER BY id`, params)).rows;
}

export async function insertGrant(tx: Queryable, grant: Omit<GrantRow, 'id'>, createdBy: string): Promise<GrantRow> {
  const { rows } = await tx.query<GrantRow>(
    `INSERT INTO grants (principal, role, capability, scope_kind, org_id, group_id, agent_id, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ${COLUMNS}`,
    [
      grant.principal,
      grant.role,
      grant.capability,
      grant.scope_kind,
      grant.org_id,
      grant.group_id,
      grant.agent_id,
      createdBy,
    ],
  );
  return rows[0];
}

/** False when there is no grant of that id in the scope. */
export async function deleteGrant(tx: Queryable, scope: GrantScope, id: string): Promise<boolean> {
  const [where, params] = scopeSql(scope);
  const { rows } = await tx.query<{ id: string }>(
    `DELETE FROM grants WHERE id = $${params.length + 1} AND ${where} RETURNING id`,
    [...params, id],
  );
  return rows.length > 0;
}

/** The grants to a principal (e.g. `group:ORG:GROUP`), oldest first. */
export async function grantsTo(db: Queryable, principal: string): Promise<Omit<GrantRow, 'id' | 'principal'>[]> {
  return (
    await db.query<Omit<GrantRow, 'id' | 'principal'>>(
      'SELECT role, capability, scope_kind, org_id, group_id, agent_id FROM grants WHERE principal = $1 ORDER BY id',
      [principal],
    )
  ).rows;
}

/** --seed-admin: the platform administrator role for a subject, once. */
export async function seedPlatformAdmin(db: Queryable, subject: string): Promise<void> {
  await db.query(
    `INSERT INTO grants (principal, scope_kind, role, created_by) VALUES ($1, 'platform', 'platform-admin', 'seed-admin') ON CONFLICT DO NOTHING`,
    [`user:${subject}`],
  );
}

/** The grants to a principal within one org, oldest first. */
export async function grantsToInOrg(db: Queryable, principal: string, org: string): Promise<GrantRow[]> {
  return (
    await db.query<GrantRow>(`SELECT ${COLUMNS} FROM grants WHERE principal = $1 AND org_id = $2 ORDER BY id`, [
      principal,
      org,
    ])
  ).rows;
}

/** A capability for a principal at a scope, unless it holds that grant already. */
export async function grantCapabilityOnce(
  tx: Queryable,
  g: { principal: string; capability: string; scope_kind: string; org_id: string; group_id: string; agent_id: string },
  createdBy: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO grants (principal, capability, scope_kind, org_id, group_id, agent_id, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
    [g.principal, g.capability, g.scope_kind, g.org_id, g.group_id, g.agent_id, createdBy],
  );
}

/** False when the principal holds no grant of that id in the org. */
export async function deleteGrantOf(tx: Queryable, principal: string, org: string, id: string): Promise<boolean> {
  return (
    (
      await tx.query('DELETE FROM grants WHERE id = $1 AND principal = $2 AND org_id = $3 RETURNING id', [
        id,
        principal,
        org,
      ])
    ).rows.length > 0
  );
}
