// The request bodies llmproxy holds at once (docs/decisions.md, "llmproxy's hot path and its memory
// under overload (P13)"). A call's body is held from the moment it is read until the call ends (it is
// inspected, sent upstream, and kept for the record): each one costs its size and then some (copies on
// the way: the prefix, the pool's view), and agents may open hundreds of connections. Every byte held is
// taken from one budget (--max-buffered-bodies); a body that does not fit is refused (503
// overloaded_error, retry-after) before it is read when its length is announced, or as soon as it
// passes the budget when it is chunked, and given back when its call ends. The gateway keeps a budget
// of the same kind (proxy/egress/body-budget.ts).

export class BodyBudget {
  readonly #max: number;
  readonly #changed: (held: number) => void;
  #held = 0;

  /** `changed` is told the bytes held after each change (dvx_llmproxy_buffered_body_bytes). */
  constructor(max: number, changed: (held: number) => void = () => undefined) {
    this.#max = max;
    this.#changed = changed;
  }

  /** Takes `bytes` from the budget; false (nothing taken) when they do not fit. */
  take(bytes: number): boolean {
    if (this.#held + bytes > this.#max) return false;
    this.#held += bytes;
    this.#changed(this.#held);
    return true;
  }

  give(bytes: number): void {
    if (bytes === 0) return;
    this.#held = Math.max(0, this.#held - bytes);
    this.#changed(this.#held);
  }

  /** Bytes held now. */
  get held(): number {
    return this.#held;
  }

  get max(): number {
    return this.#max;
  }
}
