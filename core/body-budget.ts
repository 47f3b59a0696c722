// The request bodies a proxy holds at once. A body is read whole before it is inspected and sent (up
// to 32 MB), and agents may open hundreds of connections: 256 × 32 MB is 8 GB, more than a host has.
// Every byte held is taken from one budget (--max-buffered-bodies); a body that does not fit is
// refused (503, retry later) before it is read when its length is announced, or as soon as it passes
// the budget when it is chunked, and given back when its call or exchange ends. llmproxy
// (proxy/llm/steps/read-body.ts) and the gateway (proxy/egress/exchange.ts) each keep one
// (docs/gateway.md, "Limits"; docs/decisions.md, "llmproxy's hot path and its memory under overload").

export class BodyBudget {
  readonly #max: number;
  readonly #changed: (held: number) => void;
  #held = 0;

  /** `changed` is told the bytes held after each change (the component's buffered-body-bytes gauge). */
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
