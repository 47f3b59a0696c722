import { snapshotAgent, type Snapshot } from '../../pipeline/policy/snapshot.ts';
import type { AgentIdentity } from './auth.ts';

// Whether an authenticated agent may act at all, by the policy snapshot (spec: agent lifecycle): the
// same answer for llmproxy's calls and the gateway's connections. An agent the snapshot does not list
// stands as its credential says (a new agent may not be in it yet), unless a snapshot this process
// loaded before listed it and a later one no longer does (RemovedAgents: it was removed); one it lists
// must belong to the org its credential names, and must be neither suspended, isolated nor contained.

/** How many removed agent ids are remembered; past it the oldest removal is forgotten first. */
export const MAX_REMOVED_AGENTS = 10_000;

/**
 * The agents a reload removed: listed by the snapshot before it, not by the one it loaded. Remembered
 * until a snapshot lists the id again (then the snapshot speaks for it), at most `max` of them (the
 * oldest removal forgotten first), for as long as the process runs: a credential issued before the
 * removal stays verifiable until its exp or notAfter, and the snapshot no longer says anything of its
 * agent. A process that starts has no earlier snapshot: what it learns begins with its first reload.
 */
export class RemovedAgents {
  readonly #max: number;
  /** Removed ids, oldest removal first (a Map keeps insertion order). */
  readonly #ids = new Map<string, true>();
  #last: Snapshot;

  constructor(initial: Snapshot, max = MAX_REMOVED_AGENTS) {
    this.#last = initial;
    this.#max = max;
  }

  /** Learns from a newly loaded snapshot (called once per reload); returns the ids it removed. */
  observe(snapshot: Snapshot): string[] {
    if (snapshot === this.#last) return [];
    const removed: string[] = [];
    for (const id of Object.keys(this.#last.agents))
      if (snapshotAgent(snapshot, id) === undefined) {
        this.#ids.delete(id);
        this.#ids.set(id, true);
        removed.push(id);
      }
    for (const id of Object.keys(snapshot.agents)) this.#ids.delete(id);
    while (this.#ids.size > this.#max) this.#ids.delete(this.#ids.keys().next().value!);
    this.#last = snapshot;
    return removed;
  }

  has(agentId: string): boolean {
    return this.#ids.has(agentId);
  }

  get size(): number {
    return this.#ids.size;
  }
}

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
       * suspended, isolated or contained. `removed`: a reload removed it from the snapshot.
       */
      why: 'org' | 'state' | 'removed';
      reason: string;
      identity: AgentIdentity;
      /** The agent's status and containment in the snapshot (for the log line). */
      status: string;
      contained: boolean;
    };

export function agentStanding(
  snapshot: Snapshot,
  identity: AgentIdentity,
  removed: RemovedAgents | null = null,
): AgentStanding {
  const agent = snapshotAgent(snapshot, identity.agentId);
  if (!agent) {
    if (removed?.has(identity.agentId))
      return {
        refused: true,
        why: 'removed',
        reason: 'agent was removed from the policy snapshot',
        identity,
        status: 'removed',
        contained: false,
      };
    return { refused: false, identity };
  }
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
