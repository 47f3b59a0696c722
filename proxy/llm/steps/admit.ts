import { snapshotAgent } from '../../../pipeline/policy/snapshot.ts';
import { governanceOf } from '../../../pipeline/policy/snapshot-governance.ts';
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
  const agent = snapshotAgent(snapshot, identity.agentId);
  if (agent) {
    if (agent.org_id !== identity.orgId) {
      d.log.warn(
        {
          request_id: ctx.id,
          agent_id: identity.agentId,
          token_org: identity.orgId,
          snapshot_org: agent.org_id,
        },
        'agent org does not match the snapshot',
      );
      // Recorded in the log of the org that owns the agent id: that is where the refusal is read.
      identify(ctx, { ...identity, orgId: agent.org_id, agentName: identity.agentName || agent.name });
      throw new Refusal(
        ERRORS.agentRefused,
        `token org_id "${identity.orgId}" differs from the agent's org in the snapshot`,
      );
    }
    ctx.identity = {
      ...identity,
      agentName: identity.agentName || agent.name,
      groupId: agent.group_id ?? identity.groupId,
    };
    if (agent.status === 'suspended' || agent.status === 'isolated' || agent.contained) {
      d.log.warn(
        {
          request_id: ctx.id,
          agent_id: identity.agentId,
          status: agent.status,
          contained: agent.contained,
        },
        'agent refused by its state',
      );
      throw new Refusal(ERRORS.agentRefused, agent.contained ? 'agent is contained' : `agent is ${agent.status}`);
    }
  }
  if (tierRank(snapshot.enclave.isolation_class) < tierRank(d.options.minTier)) {
    throw new Refusal(
      ERRORS.tierTooLow,
      `enclave isolation class ${snapshot.enclave.isolation_class} is below --min-tier ${d.options.minTier}`,
    );
  }
  const { orgId, groupId, agentId } = ctx.identity!;
  ctx.governance = governanceOf(snapshot, orgId, groupId, agentId);
}
