import type { Queryable } from '../../../core/sql.ts';
import { ApprovalLimitError } from '../../errors.ts';
import { countsFor } from './store.ts';

// The approval limits (spec: operator-api "Approval limits"): past any of them a create is refused with
// `approval rate limit exceeded` (429), and llmproxy turns the call's require_approval into a deny.
// Checked inside the create's transaction under its org's advisory lock (create.ts), so creates racing
// each other are counted one after the other and never exceed a limit together.

export const APPROVAL_LIMITS = {
  /** Pending (not yet due) approvals of one agent. */
  pendingPerAgent: 10,
  /** Pending (not yet due) approvals of one org. */
  pendingPerOrg: 100,
  /** Approvals one agent requested in the last hour, whatever became of them. */
  requestsPerAgentHour: 50,
} as const;

const HOUR_MS = 3600_000;

/** Throws ApprovalLimitError naming the first limit a new approval of `agent` in `org` would exceed at `nowMs`. */
export async function checkLimits(tx: Queryable, org: string, agent: string, nowMs: number): Promise<void> {
  const c = await countsFor(tx, org, agent, new Date(nowMs), new Date(nowMs - HOUR_MS));
  if (c.agentPending >= APPROVAL_LIMITS.pendingPerAgent)
    throw new ApprovalLimitError(`${APPROVAL_LIMITS.pendingPerAgent} pending approvals per agent`);
  if (c.orgPending >= APPROVAL_LIMITS.pendingPerOrg)
    throw new ApprovalLimitError(`${APPROVAL_LIMITS.pendingPerOrg} pending approvals per org`);
  if (c.agentLastHour >= APPROVAL_LIMITS.requestsPerAgentHour)
    throw new ApprovalLimitError(`${APPROVAL_LIMITS.requestsPerAgentHour} approval requests per agent per hour`);
}
