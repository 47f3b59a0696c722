// The request bodies the gateway holds at once (docs/gateway.md, "Interception and capture",
// "Limits"). A captured request's body is read whole before it is inspected and sent (up to 32 MB);
// each connection carries one such request at a time (pipelining.ts), but an agent may open hundreds
// of connections (--max-connections-per-client, 256 by default): 256 × 32 MB is 8 GB, more than a
// gateway host has. Every byte held for inspection is taken from one budget (--max-buffered-bodies);
// a body that does not fit is refused (503, retry later) before it is read, or as soon as it passes
// the budget when its length was not announced (chunked), and given back when its exchange ends.

export class BodyBudget {
  readonly #max: number;
  readonly #changed: (held: number) => void;
  #held = 0;

  /** `changed` is told the bytes held after each change (dvx_gateway_buffered_body_bytes). */
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
}
