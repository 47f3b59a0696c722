import type { BrokerHarness } from '../../fixtures/broker-harness.ts';

// Agents as the control plane's events would have put them in the broker's store (convergence writes
// them in production); the secrets tests need only the rows.
export async function addAgent(
  h: BrokerHarness,
  uid: string,
  org: string,
  group: string | null,
  status = 'active',
  contained = false,
): Promise<void> {
  await h.broker.deps.db.query(
    `INSERT INTO broker_agents (uid, org_id, group_id, name, status, contained) VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (uid) DO UPDATE SET org_id = $2, group_id = $3, status = $5, contained = $6`,
    [uid, org, group, `name-${uid}`, status, contained],
  );
}
