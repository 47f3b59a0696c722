import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import { getAgent, refusalOf } from '../agents.ts';
import { auditedChange, auditRefusal, type BrokerActor } from '../audit.ts';
import type { BrokerDeps } from '../deps.ts';
import { ApprovalAgentRefusedError, ApprovalSettledError } from '../../errors.ts';
import { announce, logChange } from './feed.ts';
import { getApproval, lockApproval, settleApproval } from './store.ts';
import { approvalView, EXPIRY_ACTOR, isDue, type ApprovalView } from './view.ts';

// A pending approval settles once, to one of:
//   approved | denied   an operator decided (decided_by: the operator's subject), with an optional reason
//   cancelled           llmproxy gave the call up (its client left): decided_by `satellite`
//   expired             nobody decided before expires_at: decided_by `escalation-timeout` (the sweeper,
//                       or the first decide or cancel that finds it due)
// Each change runs under the row's lock, audited (capture-or-deny) with its actor, logged to the feed
// and announced once committed. Settling one that is no longer pending is ApprovalSettledError (409).
// An approval whose agent may no longer act (contained, suspended or isolated since the call was held,
// or gone from this enclave or its org) is not approved: 409, the refusal audited; it can still be denied.

export type Outcome = 'approved' | 'denied' | 'cancelled';

const ACTION: Record<Outcome | 'expired', string> = {
  approved: 'approval.approve',
  denied: 'approval.deny',
  cancelled: 'approval.cancel',
  expired: 'approval.expire',
};

export const EXPIRY_REASON = 'no decision before expires_at';
const EXPIRY: BrokerActor = { subject: EXPIRY_ACTOR, kind: 'service' };

/**
 * Settles approval `id` (of org `org`, or of any org when null) to `to`, decided by the actor's
 * subject; null when there is no such approval (in that org).
 */
export async function settle(
  deps: BrokerDeps,
  actor: BrokerActor,
  id: string,
  org: string | null,
  to: Outcome,
  reason: string | null,
): Promise<ApprovalView | null> {
  const row = await getApproval(deps.db, id);
  if (!row || (org !== null && row.org_id !== org)) return null;
  if (row.status !== 'pending') throw new ApprovalSettledError(id, row.status);
  if (isDue(row, deps.now())) {
    await expire(deps, id);
    throw new ApprovalSettledError(id, 'expired');
  }
  try {
    return await change(deps, actor, row.org_id, id, to, reason);
  } catch (err) {
    if (err instanceof ApprovalAgentRefusedError) {
      await auditRefusal(deps, actor, ACTION[to], row.org_id, `approval:${id}`, err.message);
      throw new ApiError(PROBLEMS.conflict, `${err.message}: its held call cannot be approved`);
    }
    // Due while it waited for the row's lock: expired, then refused like the rest.
    if (err instanceof ApprovalSettledError && err.status === 'due') {
      await expire(deps, id);
      throw new ApprovalSettledError(id, 'expired');
    }
    throw err;
  }
}

/** Marks approval `id` expired when it is pending and due; returns its view, or null when it was not. */
export async function expire(deps: BrokerDeps, id: string): Promise<ApprovalView | null> {
  const row = await getApproval(deps.db, id);
  if (!row || !isDue(row, deps.now())) return null;
  try {
    return await change(deps, EXPIRY, row.org_id, id, 'expired', EXPIRY_REASON);
  } catch (err) {
    if (err instanceof ApprovalSettledError) return null; // settled meanwhile
    throw err;
  }
}

async function change(
  deps: BrokerDeps,
  actor: BrokerActor,
  orgId: string,
  id: string,
  to: Outcome | 'expired',
  reason: string | null,
): Promise<ApprovalView> {
  const logged = await auditedChange(deps, actor, ACTION[to], orgId, async (tx) => {
    const locked = await lockApproval(tx, id);
    if (locked?.status !== 'pending') throw new ApprovalSettledError(id, locked?.status ?? 'gone');
    const now = deps.now();
    const due = isDue(locked, now);
    if (to === 'expired' ? !due : due) throw new ApprovalSettledError(id, to === 'expired' ? 'pending' : 'due');
    if (to === 'approved') {
      const agent = await getAgent(tx, locked.agent_id);
      if (!agent || agent.org_id !== locked.org_id)
        throw new ApprovalAgentRefusedError(
          `agent ${locked.agent_id} is no longer in org ${locked.org_id} in this enclave`,
        );
      const refusal = refusalOf(agent);
      if (refusal) throw new ApprovalAgentRefusedError(refusal);
    }
    const row = await settleApproval(tx, id, {
      status: to,
      reason,
      decidedBy: actor.subject,
      decidedAt: to === 'expired' ? new Date(locked.expires_at) : new Date(now),
    });
    return {
      result: await logChange(deps, tx, row),
      resource: `approval:${id}`,
      ...(reason === null ? {} : { reason }),
      attrs: {
        agent_id: row.agent_id,
        tool: row.tool,
        status: row.status,
        rule: row.rule,
        args_digest: row.args_digest,
        policy_version: row.policy_version,
      },
    };
  });
  announce(deps, logged);
  return approvalView(logged.row, deps.now());
}
