import type { Queryable } from '../../core/sql.ts';

// Custom roles in the store (spec: roleView); the built-in ones live in authz/capabilities.ts.

export interface RoleView {
  name: string;
  capabilities: string[];
}

export async function customRoleExists(db: Queryable, role: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM roles WHERE name = $1', [role])).rows.length > 0;
}

export async function listCustomRoles(db: Queryable): Promise<RoleView[]> {
  return (await db.query<RoleView>('SELECT name, capabilities FROM roles ORDER BY name')).rows;
}

export async function insertRole(tx: Queryable, role: RoleView, createdBy: string): Promise<void> {
  await tx.query('INSERT INTO roles (name, capabilities, created_by) VALUES ($1, $2, $3)', [
    role.name,
    role.capabilities,
    createdBy,
  ]);
}

/** False when there is no such custom role. */
export async function updateRole(tx: Queryable, role: RoleView): Promise<boolean> {
  return (
    (
      await tx.query('UPDATE roles SET capabilities = $2 WHERE name = $1 RETURNING name', [
        role.name,
        role.capabilities,
      ])
    ).rows.length > 0
  );
}

export async function roleIsGranted(tx: Queryable, role: string): Promise<boolean> {
  return (await tx.query('SELECT 1 FROM grants WHERE role = $1 LIMIT 1', [role])).rows.length > 0;
}

/** False when there is no such custom role. */
export async function deleteRole(tx: Queryable, role: string): Promise<boolean> {
  return (await tx.query('DELETE FROM roles WHERE name = $1 RETURNING name', [role])).rows.length > 0;
}
