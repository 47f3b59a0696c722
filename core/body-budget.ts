// The request bodies a proxy holds at once. A body is read whole before it is inspected and sent (up
// to 32 MB), and agents may open hundreds of connections: 256 × 32 MB is 8 GB, more than a host has.
// Every byte held is taken from one budget (--max-buffered-bodies), as it arrives: what is held is what
// is in memory, never what a client merely announced (an announced length taken up front let one agent
// that announced 32 MB and sent it a byte a second hold that share with nothing in memory: a denial of
// service for every other agent). An announced length is only checked against what is free now, so a
// body that cannot fit is refused before it is read. No agent holds more than its share
// (--max-buffered-bodies-per-agent, half the budget unless set), so one agent, however many
// connections it opens, leaves the rest to the others. A body that does not fit is refused (503, retry
// later), and everything it took given back when its call or exchange ends, whatever the path. llmproxy
// (proxy/llm/steps/read-body.ts) and the gateway (proxy/egress/exchange.ts) each keep one
// (docs/gateway.md, "Limits"; docs/decisions.md, "The body budget takes bytes as they arrive").

/** Why bytes did not fit: the whole budget, or the agent's share of it. */
export type BudgetShortfall = 'budget' | 'agent';

export class BodyBudget {
  readonly #max: number;
  readonly #perAgent: number;
  readonly #changed: (held: number) => void;
  #held = 0;
  /** Bytes held per agent; an agent holding nothing has no entry (the map never grows with idle agents). */
  readonly #byAgent = new Map<string, number>();

  /**
   * `perAgent`: the most one agent may hold at once (at most `max`). `changed` is told the bytes held
   * after each change (the component's buffered-body-bytes gauge).
   */
  constructor(max: number, perAgent: number, changed: (held: number) => void = () => undefined) {
    if (!(Number.isSafeInteger(max) && max >= 1)) throw new RangeError('a body budget is a positive byte count');
    if (!(Number.isSafeInteger(perAgent) && perAgent >= 1 && perAgent <= max))
      throw new RangeError("an agent's share of a body budget is a positive byte count no larger than the budget");
    this.#max = max;
    this.#perAgent = perAgent;
    this.#changed = changed;
  }

  /** Whether `bytes` more would fit now for `agent`, without taking them: null, or what they do not fit in. */
  shortfall(agent: string, bytes: number): BudgetShortfall | null {
    if (this.#held + bytes > this.#max) return 'budget';
    if (this.heldBy(agent) + bytes > this.#perAgent) return 'agent';
    return null;
  }

  /** Takes `bytes` for `agent`; null when taken, else what they do not fit in (nothing taken). */
  take(agent: string, bytes: number): BudgetShortfall | null {
    const short = this.shortfall(agent, bytes);
    if (short !== null || bytes === 0) return short;
    this.#held += bytes;
    this.#byAgent.set(agent, this.heldBy(agent) + bytes);
    this.#changed(this.#held);
    return null;
  }

  /** Gives back `bytes` `agent` took (never more than it holds). */
  give(agent: string, bytes: number): void {
    if (bytes <= 0) return;
    const had = this.heldBy(agent);
    const back = Math.min(bytes, had);
    if (back === 0) return;
    if (had === back) this.#byAgent.delete(agent);
    else this.#byAgent.set(agent, had - back);
    this.#held -= back;
    this.#changed(this.#held);
  }

  /** Bytes held now, over every agent. */
  get held(): number {
    return this.#held;
  }

  /** Bytes `agent` holds now. */
  heldBy(agent: string): number {
    return this.#byAgent.get(agent) ?? 0;
  }

  get max(): number {
    return this.#max;
  }

  get perAgent(): number {
    return this.#perAgent;
  }
}

/** What is wrong with --max-buffered-bodies-per-agent (0: unset) against the budget, or null. */
export function agentShareProblem(perAgent: number, max: number): string | null {
  if (!Number.isSafeInteger(perAgent) || perAgent < 0)
    return '--max-buffered-bodies-per-agent must be a byte count (0: half of --max-buffered-bodies)';
  if (perAgent > max) return '--max-buffered-bodies-per-agent must not exceed --max-buffered-bodies';
  return null;
}

/** An agent's share of the budget when --max-buffered-bodies-per-agent is not set: half of it. */
export function defaultAgentShare(max: number): number {
  return Math.max(1, Math.floor(max / 2));
}
