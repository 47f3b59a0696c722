// The refused tool calls of the answers llmproxy rewrote, remembered per (agent, answer id), for the
// conversations a provider holds itself (docs/tool-policy.md, "Server-held conversations"): an
// Anthropic thread (`thread: {type: "continue", previous_message_id}`) or a Responses chain
// (`previous_response_id`). The provider remembers the ORIGINAL answer, refused calls included, and
// refuses a next turn that does not answer every one of them; steps/refused-results.ts answers them,
// with the denial the agent read, from this memory.
//
// Bounded: at most `maxAnswers` answers and `maxBytes` of their text (least recently used first out),
// each for `ttlMs`. Per llmproxy process: a continuation that reaches another process (or comes after a
// restart or an eviction) is forwarded as sent, and the provider's own error reaches the agent.
// Keys come from outside (model-written ids, agent ids): a Map, never an object's properties.

/** One refused call of an answer, as the agent read it. */
export interface RememberedRefusal {
  /** The call's id as the agent saw it: Anthropic `tool_use.id`, Responses `call_id`. */
  callId: string;
  tool: string;
  /** The denial the agent read in place of the call (already shaped by --inspection-disclosure). */
  message: string;
  /** A Responses `custom_tool_call` (answered by a `custom_tool_call_output`). */
  custom?: boolean;
}

export interface RefusalMemoryOptions {
  /** Answers remembered at most (default 10,000). */
  maxAnswers?: number;
  /** Bytes of ids, names and messages remembered at most (default 64 MiB). */
  maxBytes?: number;
  /** How long an answer is remembered (default 24 h). */
  ttlMs?: number;
  now?: () => number;
}

interface Entry {
  agentId: string;
  refusals: readonly RememberedRefusal[];
  bytes: number;
  expires: number;
}

export const DEFAULT_MAX_ANSWERS = 10_000;
export const DEFAULT_MAX_BYTES = 64 * 1024 * 1024;
export const DEFAULT_TTL_MS = 24 * 60 * 60 * 1000;
/** Per entry, for the Map's key and the record around the strings: a rough, fixed allowance. */
const ENTRY_OVERHEAD_BYTES = 128;

export class RefusalMemory {
  readonly maxAnswers: number;
  readonly maxBytes: number;
  readonly ttlMs: number;
  #now: () => number;
  /** In least-recently-used order (a Map keeps insertion order; a use re-inserts). */
  #entries = new Map<string, Entry>();
  /** Answers remembered per agent: a call of an agent with none costs one lookup. */
  #perAgent = new Map<string, number>();
  #bytes = 0;
  /** Entries dropped to stay within the bounds (not the expired ones). */
  evictions = 0;

  constructor(options: RefusalMemoryOptions = {}) {
    this.maxAnswers = Math.max(1, options.maxAnswers ?? DEFAULT_MAX_ANSWERS);
    this.maxBytes = Math.max(1, options.maxBytes ?? DEFAULT_MAX_BYTES);
    this.ttlMs = Math.max(1, options.ttlMs ?? DEFAULT_TTL_MS);
    this.#now = options.now ?? Date.now;
  }

  get size(): number {
    return this.#entries.size;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** Whether anything is remembered for this agent (the request step's first, free check). */
  holdsAgent(agentId: string): boolean {
    return this.#perAgent.has(agentId);
  }

  /**
   * Remembers refused calls of an answer, added to those already remembered for it (a stream reports
   * them one by one, as each is decided); a call remembered again replaces its first record.
   */
  remember(agentId: string, answerId: string, more: readonly RememberedRefusal[]): void {
    if (more.length === 0 || answerId === '') return;
    const key = keyOf(agentId, answerId);
    const known = this.#entries.get(key);
    let refusals = more;
    if (known !== undefined && known.expires > this.#now()) {
      const again = new Set(more.map((m) => m.callId));
      refusals = [...known.refusals.filter((r) => !again.has(r.callId)), ...more];
    }
    this.#delete(key);
    let bytes = ENTRY_OVERHEAD_BYTES + 2 * key.length;
    for (const r of refusals) bytes += 2 * (r.callId.length + r.tool.length + r.message.length) + 64;
    // One answer larger than the whole budget is not remembered (nothing else would fit beside it).
    if (bytes > this.maxBytes) return;
    const copy = refusals.map(({ callId, tool, message, custom }) => ({
      callId,
      tool,
      message,
      ...(custom ? { custom: true } : {}),
    }));
    this.#entries.set(key, { agentId, refusals: copy, bytes, expires: this.#now() + this.ttlMs });
    this.#perAgent.set(agentId, (this.#perAgent.get(agentId) ?? 0) + 1);
    this.#bytes += bytes;
    this.#dropExpired();
    while (this.#entries.size > this.maxAnswers || this.#bytes > this.maxBytes) {
      const oldest = this.#entries.keys().next().value as string;
      this.#delete(oldest);
      this.evictions++;
    }
  }

  /** The refused calls of this agent's answer, or null (never remembered, expired or evicted). */
  recall(agentId: string, answerId: string): readonly RememberedRefusal[] | null {
    const key = keyOf(agentId, answerId);
    const entry = this.#entries.get(key);
    if (entry === undefined) return null;
    if (entry.expires <= this.#now()) {
      this.#delete(key);
      return null;
    }
    // Used: now the most recent.
    this.#entries.delete(key);
    this.#entries.set(key, entry);
    return entry.refusals;
  }

  /** Expired entries at the old end go (each one's expiry is its insertion time plus one ttl). */
  #dropExpired(): void {
    const now = this.#now();
    for (const [key, entry] of this.#entries) {
      if (entry.expires > now) break;
      this.#delete(key);
    }
  }

  #delete(key: string): void {
    const entry = this.#entries.get(key);
    if (entry === undefined) return;
    this.#entries.delete(key);
    this.#bytes -= entry.bytes;
    const left = (this.#perAgent.get(entry.agentId) ?? 1) - 1;
    if (left <= 0) this.#perAgent.delete(entry.agentId);
    else this.#perAgent.set(entry.agentId, left);
  }
}

/** The pair as one key, unambiguous whatever either holds (the agent id's length leads). */
function keyOf(agentId: string, answerId: string): string {
  return `${agentId.length}:${agentId}${answerId}`;
}
