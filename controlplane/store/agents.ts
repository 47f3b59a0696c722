import type { Queryable } from '../../core/sql.ts';

// Agents in the store (spec: agentView, States and transitions).

export interface AgentRow {
  uid: string;
  org_id: string;
  name: string;
  image: string;
  command: string[];
  enclave_id: string;
  group_id: string;
  status: string;
  contained: boolean;
  policy_packs: string[];
}

const COLUMNS = 'uid, org_id, name, image, command, enclave_id, group_id, status, contained, policy_packs';

/** An agent by uid; undefined when there is no such agent. */
export async function getAgent(db: Queryable, uid: string): Promise<AgentRow | undefined> {
  return (await db.query<AgentRow>(`SELECT ${COLUMNS} FROM agents WHERE uid = $1`, [uid])).rows[0];
}

export async function getAgentInOrg(db: Queryable, org: string, uid: string): Promise<AgentRow | undefined> {
  return (await db.query<AgentRow>(`SELECT ${COLUMNS} FROM agents WHERE org_id = $1 AND uid = $2`, [org, uid])).rows[0];
}

export async function listAgents(db: Queryable, org: string): Promise<AgentRow[]> {
  return (await db.query<AgentRow>(`SELECT ${COLUMNS} FROM agents WHERE org_id = $1 ORDER BY uid`, [org])).rows;
}

/** Sets the status and/or containment given (null keeps it). */
export async function setAgentState(
  tx: Queryable,
  uid: string,
  change: { status: string | null; contained: boolean | null },
): Promise<AgentRow> {
  const { rows } = await tx.query<AgentRow>(
    `UPDATE agents SET status = coalesce($2, status), contained = coalesce($3, contained), updated_at = now() WHERE uid = $1 RETURNING ${COLUMNS}`,
    [uid, change.status, change.contained],
  );
  return rows[0];
}

/**
 * Sets the status of an agent of `enclave` only when it is now one of `from` (the check and the write in
 * one statement, so an operator's change made meanwhile is never overwritten). Undefined when the agent
 * is not of that enclave or not in one of `from`.
 */
export async function setAgentStatusFrom(
  tx: Queryable,
  uid: string,
  enclave: string,
  status: string,
  from: readonly string[],
): Promise<AgentRow | undefined> {
  const { rows } = await tx.query<AgentRow>(
    `UPDATE agents SET status = $3, updated_at = now() WHERE uid = $1 AND enclave_id = $2 AND status = ANY($4::text[]) RETURNING ${COLUMNS}`,
    [uid, enclave, status, [...from]],
  );
  return rows[0];
}

/** Create or update on `uid`, with the agent's packs installed at its own scope (composed at read time). */
export async function upsertAgent(
  tx: Queryable,
  a: {
    uid: string;
    org: string;
    name: string;
    image: string;
    command: string[];
    enclave: string;
    group: string;
    packs: string[];
  },
  createdBy: string,
): Promise<AgentRow> {
  const { rows } = await tx.query<AgentRow>(
    `INSERT INTO agents (uid, org_id, name, image, command, enclave_id, group_id, policy_packs, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (uid) DO UPDATE SET name = EXCLUDED.name, image = EXCLUDED.image, command = EXCLUDED.command, enclave_id = EXCLUDED.enclave_id,
       group_id = EXCLUDED.group_id, policy_packs = EXCLUDED.policy_packs, updated_at = now()
     RETURNING ${COLUMNS}`,
    [a.uid, a.org, a.name, a.image, a.command, a.enclave, a.group, a.packs, createdBy],
  );
  await tx.query(`DELETE FROM pack_installs WHERE scope_kind = 'agent' AND agent_id = $1`, [a.uid]);
  for (const pack of new Set(a.packs)) {
    await tx.query(
      `INSERT INTO pack_installs (pack, scope_kind, org_id, agent_id, installed_by) VALUES ($1, 'agent', $2, $3, $4)`,
      [pack, a.org, a.uid, createdBy],
    );
  }
  return rows[0];
}

/** Deletes the agent with everything stored at its scope (config, packs, governance, values). */
export async function deleteAgent(tx: Queryable, uid: string): Promise<void> {
  await tx.query('DELETE FROM agent_config WHERE agent_id = $1', [uid]);
  await tx.query(`DELETE FROM pack_installs WHERE scope_kind = 'agent' AND agent_id = $1`, [uid]);
  await tx.query(`DELETE FROM governance_policy WHERE scope_kind = 'agent' AND agent_id = $1`, [uid]);
  await tx.query(`DELETE FROM config_values WHERE scope_kind = 'agent' AND agent_id = $1`, [uid]);
  await tx.query('DELETE FROM agents WHERE uid = $1', [uid]);
}
