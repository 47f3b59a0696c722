import { governanceOf } from '../../../pipeline/policy/snapshot-governance.ts';
import { agentStanding, type RemovedAgents } from '../agent-standing.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { tierRank } from '../options.ts';
import { identify } from './authenticate.ts';

// Whether this agent may call at all, by the snapshot: its org, its state (suspended, isolated,
// contained) and the enclave's isolation class against --min-tier. The agent known, its governance
// policy is resolved for the call (ctx.governance).

export function admit(ctx: CallContext): void {
  const d = ctx.d;
  const snapshot = ctx.snapshot;
  const identity = ctx.identity!;
  const standing = agentStanding(snapshot, identity, removedNow(ctx));
  if (standing.refused && standing.why === 'org') {
    d.log.warn(
      {
        request_id: ctx.id,
        agent_id: identity.agentId,
        token_org: identity.orgId,
        snapshot_org: standing.identity.orgId,
      },
      'agent org does not match the snapshot',
    );
    // Recorded in the log of the org that owns the agent id: that is where the refusal is read.
    identify(ctx, standing.identity);
    throw new Refusal(ERRORS.agentRefused, standing.reason);
  }
  ctx.identity = standing.identity;
  if (standing.refused) {
    d.log.warn(
      {
        request_id: ctx.id,
        agent_id: identity.agentId,
        status: standing.status,
        contained: standing.contained,
      },
      'agent refused by its state',
    );
    throw new Refusal(ERRORS.agentRefused, standing.reason);
  }
  if (tierRank(snapshot.enclave.isolation_class) < tierRank(d.options.minTier)) {
    throw new Refusal(
      ERRORS.tierTooLow,
      `enclave isolation class ${snapshot.enclave.isolation_class} is below --min-tier ${d.options.minTier}`,
    );
  }
  const { orgId, groupId, agentId } = ctx.identity!;
  ctx.governance = governanceOf(snapshot, orgId, groupId, agentId);
  ctx.admitted = true;
}

/** The removed agents as of the snapshot now current (a reload not yet re-checked is learnt now). */
export function removedNow(ctx: CallContext): RemovedAgents {
  ctx.d.removed.observe(ctx.d.snapshot());
  return ctx.d.removed;
}
