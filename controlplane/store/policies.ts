import type { Queryable } from '../../core/sql.ts';

// The LLM policy rows of a service (service_config: platform and org rows, no group here) and the
// agents' overrides (agent_config), for routes/policy.ts.

export type ServiceScope = 'platform' | 'org';

export interface ServiceRow {
  key: string;
  value: string;
  locked: boolean;
}

/** The rows of `service` at one scope (org '' for platform), by key. */
export async function serviceRows(
  db: Queryable,
  service: string,
  scope: ServiceScope,
  org: string,
): Promise<ServiceRow[]> {
  const { rows } = await db.query<ServiceRow>(
    `SELECT key, value, locked FROM service_config
     WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = '' ORDER BY key`,
    [service, scope, org],
  );
  return rows;
}

/** The row of `key` at one scope of any kind (platform, org or group), if set. */
export async function serviceRowAt(
  db: Queryable,
  service: string,
  at: { kind: string; org: string; group: string },
  key: string,
): Promise<Omit<ServiceRow, 'key'> | undefined> {
  const { rows } = await db.query<Omit<ServiceRow, 'key'>>(
    `SELECT value, locked FROM service_config
     WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND key = $5`,
    [service, at.kind, at.org, at.group, key],
  );
  return rows[0];
}

export async function putServiceRow(
  tx: Queryable,
  service: string,
  scope: ServiceScope,
  org: string,
  row: ServiceRow,
  by: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO service_config (service, scope_kind, org_id, group_id, key, value, locked, updated_by)
     VALUES ($1, $2, $3, '', $4, $5, $6, $7)
     ON CONFLICT (service, scope_kind, org_id, group_id, key) DO UPDATE
       SET value = EXCLUDED.value, locked = EXCLUDED.locked, updated_by = EXCLUDED.updated_by, updated_at = now()`,
    [service, scope, org, row.key, row.value, row.locked, by],
  );
}

/** Whether there was a row to delete. */
export async function deleteServiceRow(
  tx: Queryable,
  service: string,
  scope: ServiceScope,
  org: string,
  key: string,
): Promise<boolean> {
  const { rows } = await tx.query(
    `DELETE FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = '' AND key = $4
     RETURNING key`,
    [service, scope, org, key],
  );
  return rows.length > 0;
}

/** An agent's overrides of `service`, by key. */
export async function agentOverrides(
  db: Queryable,
  service: string,
  agent: string,
): Promise<{ key: string; value: string }[]> {
  const { rows } = await db.query<{ key: string; value: string }>(
    'SELECT key, value FROM agent_config WHERE override_service = $1 AND agent_id = $2 ORDER BY key',
    [service, agent],
  );
  return rows;
}

export async function putAgentOverride(
  tx: Queryable,
  service: string,
  agent: { uid: string; org_id: string },
  row: { key: string; value: string },
  by: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO agent_config (override_service, agent_id, org_id, key, value, updated_by)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (override_service, agent_id, key) DO UPDATE
       SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()`,
    [service, agent.uid, agent.org_id, row.key, row.value, by],
  );
}

/** Whether there was an override to delete. */
export async function deleteAgentOverride(
  tx: Queryable,
  service: string,
  agent: string,
  key: string,
): Promise<boolean> {
  const { rows } = await tx.query(
    'DELETE FROM agent_config WHERE override_service = $1 AND agent_id = $2 AND key = $3 RETURNING key',
    [service, agent, key],
  );
  return rows.length > 0;
}
