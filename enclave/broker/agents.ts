import type { Queryable } from '../../core/sql.ts';

// The agents this enclave runs, as the broker knows them (broker_agents). The control plane authors
// suspended / isolated / contained; the broker owns provisioning and active, and suspends an agent whose
// refresh token was replayed. An agent in a refused state gets 403 on every agent route.

export const AGENT_STATUSES = ['created', 'provisioning', 'active', 'suspended', 'isolated'] as const;
export type AgentStatus = (typeof AGENT_STATUSES)[number];
export const REFUSED_STATUSES: readonly string[] = ['suspended', 'isolated'];

export interface BrokerAgent {
  uid: string;
  org_id: string;
  group_id: string | null;
  name: string;
  status: AgentStatus;
  cp_status: string | null;
  contained: boolean;
  reason: string | null;
}

const COLUMNS = 'uid, org_id, group_id, name, status, cp_status, contained, reason';

export async function getAgent(db: Queryable, uid: string): Promise<BrokerAgent | null> {
  const { rows } = await db.query<BrokerAgent>(`SELECT ${COLUMNS} FROM broker_agents WHERE uid = $1`, [uid]);
  return rows[0] ?? null;
}

/**
 * The agent's row, locked for the rest of the transaction `tx`: a change of it committed meanwhile (an
 * operator's suspension converged, an exchange) is waited for and seen, never overwritten.
 */
export async function lockAgent(tx: Queryable, uid: string): Promise<BrokerAgent | null> {
  const { rows } = await tx.query<BrokerAgent>(`SELECT ${COLUMNS} FROM broker_agents WHERE uid = $1 FOR UPDATE`, [uid]);
  return rows[0] ?? null;
}

export async function listAgents(db: Queryable): Promise<BrokerAgent[]> {
  return (await db.query<BrokerAgent>(`SELECT ${COLUMNS} FROM broker_agents ORDER BY uid`)).rows;
}

/** Why an agent may not use the agent routes now, or null when it may. */
export function refusalOf(agent: Pick<BrokerAgent, 'status' | 'contained' | 'uid'>): string | null {
  if (agent.contained) return `agent ${agent.uid} is contained`;
  if (REFUSED_STATUSES.includes(agent.status)) return `agent ${agent.uid} is ${agent.status}`;
  return null;
}

/**
 * Changes an agent's status (and why) and queues the change for the control plane (broker_status_outbox,
 * delivered by status-report.ts, kept while the control plane is away). Returns the row, or null for an
 * agent the broker does not know. Call it inside the transaction of the change it belongs to.
 */
export async function changeStatus(
  tx: Queryable,
  uid: string,
  status: AgentStatus,
  reason: string | null,
): Promise<BrokerAgent | null> {
  const row = await setStatus(tx, uid, status, reason);
  if (row)
    await tx.query(
      `INSERT INTO broker_status_outbox (agent_uid, status, reason) VALUES ($1, $2, $3)
       ON CONFLICT (agent_uid) DO UPDATE SET status = EXCLUDED.status, reason = EXCLUDED.reason, queued_at = now(), attempts = 0`,
      [uid, status, reason],
    );
  return row;
}

/** Sets the broker-side status (and why) without reporting it; returns the row, or null for an unknown agent. */
export async function setStatus(
  db: Queryable,
  uid: string,
  status: AgentStatus,
  reason: string | null,
): Promise<BrokerAgent | null> {
  const { rows } = await db.query<BrokerAgent>(
    `UPDATE broker_agents SET status = $2, reason = $3, updated_at = now() WHERE uid = $1 RETURNING ${COLUMNS}`,
    [uid, status, reason],
  );
  return rows[0] ?? null;
}
