import { snapshotAgent, type Snapshot } from '../../pipeline/policy/snapshot.ts';
import type { AgentIdentity } from './auth.ts';

// Whether an authenticated agent may act at all, by the policy snapshot (spec: agent lifecycle): the
// same answer for llmproxy's calls and the gateway's connections. An agent the snapshot does not list
// stands as its credential says; one it lists must belong to the org its credential names, and must
// be neither suspended, isolated nor contained.

export type AgentStanding =
  | {
      refused: false;
      /** The identity completed from the snapshot: its name when the credential had none, its group. */
      identity: AgentIdentity;
    }
  | {
      refused: true;
      /**
       * `org`: the credential's org differs from the snapshot's; `identity` then carries the snapshot's
       * org (the refusal belongs in the log of the org that owns the agent id). `state`: the agent is
       * suspended, isolated or contained.
       */
      why: 'org' | 'state';
      reason: string;
      identity: AgentIdentity;
      /** The agent's status and containment in the snapshot (for the log line). */
      status: string;
      contained: boolean;
    };

export function agentStanding(snapshot: Snapshot, identity: AgentIdentity): AgentStanding {
  const agent = snapshotAgent(snapshot, identity.agentId);
  if (!agent) return { refused: false, identity };
  if (agent.org_id !== identity.orgId) {
    return {
      refused: true,
      why: 'org',
      reason: `token org_id "${identity.orgId}" differs from the agent's org in the snapshot`,
      identity: { ...identity, orgId: agent.org_id, agentName: identity.agentName || agent.name },
      status: agent.status,
      contained: agent.contained,
    };
  }
  const completed = {
    ...identity,
    agentName: identity.agentName || agent.name,
    groupId: agent.group_id ?? identity.groupId,
  };
  if (agent.status === 'suspended' || agent.status === 'isolated' || agent.contained) {
    return {
      refused: true,
      why: 'state',
      reason: agent.contained ? 'agent is contained' : `agent is ${agent.status}`,
      identity: completed,
      status: agent.status,
      contained: agent.contained,
    };
  }
  return { refused: false, identity: completed };
}
