import type { Queryable } from '../../core/sql.ts';
import type { RowKey } from './governance-policies.ts';

// Policy packs and where they are installed, in the store (spec: definePackReq, installations).
// A scope is given as its row key [scope_kind, org_id, group_id, agent_id] (scope-query.ts, rowKey).

export interface PackRow {
  name: string;
  allow: string;
  deny: string;
  config: string;
}

export async function packExists(db: Queryable, name: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM policy_packs WHERE name = $1', [name])).rows.length > 0;
}

export async function listPacks(db: Queryable): Promise<PackRow[]> {
  return (await db.query<PackRow>('SELECT name, allow, deny, config FROM policy_packs ORDER BY name')).rows;
}

/** Define or redefine a pack (its rules and config as JSON text). */
export async function upsertPack(tx: Queryable, p: PackRow, createdBy: string): Promise<void> {
  await tx.query(
    `INSERT INTO policy_packs (name, allow, deny, config, created_by) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (name) DO UPDATE SET allow = EXCLUDED.allow, deny = EXCLUDED.deny, config = EXCLUDED.config, updated_at = now()`,
    [p.name, p.allow, p.deny, p.config, createdBy],
  );
}

/** The scopes a pack is installed at. */
export async function packInstallations(
  tx: Queryable,
  name: string,
): Promise<{ scope_kind: string; org_id: string; group_id: string; agent_id: string }[]> {
  return (
    await tx.query<{ scope_kind: string; org_id: string; group_id: string; agent_id: string }>(
      'SELECT scope_kind, org_id, group_id, agent_id FROM pack_installs WHERE pack = $1',
      [name],
    )
  ).rows;
}

/** False when the pack was installed there already. */
export async function installPack(tx: Queryable, name: string, at: RowKey, installedBy: string): Promise<boolean> {
  const { rows } = await tx.query(
    `INSERT INTO pack_installs (pack, scope_kind, org_id, group_id, agent_id, installed_by) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING pack`,
    [name, ...at, installedBy],
  );
  return rows.length > 0;
}

/** False when the pack was not installed there. */
export async function uninstallPack(tx: Queryable, name: string, at: RowKey): Promise<boolean> {
  const { rows } = await tx.query(
    'DELETE FROM pack_installs WHERE pack = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND agent_id = $5 RETURNING pack',
    [name, ...at],
  );
  return rows.length > 0;
}

/** The rules of the packs installed at one scope, by name. */
export async function packRulesAt(db: Queryable, at: RowKey): Promise<{ name: string; allow: string; deny: string }[]> {
  return (
    await db.query<{ name: string; allow: string; deny: string }>(
      `SELECT p.name, p.allow, p.deny FROM pack_installs i JOIN policy_packs p ON p.name = i.pack
        WHERE i.scope_kind = $1 AND i.org_id = $2 AND i.group_id = $3 AND i.agent_id = $4 ORDER BY p.name`,
      at,
    )
  ).rows;
}
