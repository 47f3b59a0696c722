import type { WireFormat } from '../../pipeline/policy/snapshot.ts';

// Audit, then replay (spec: response flow): a streamed answer's final event is held until the call's
// record is appended (durable, with a durable sink). Everything before it flows as it arrives; bytes
// at the end of a chunk that could be the start of the final event's line wait for the next chunk,
// so no part of that event leaves early.

const MARKERS: Record<WireFormat, string[]> = {
  'anthropic-messages': ['event: message_stop'],
  'openai-chat': ['data: [DONE]'],
  'openai-responses': ['event: response.completed', 'event: response.incomplete', 'event: response.failed'],
};

export class FinalEventGuard {
  #markers: Buffer[];
  #longest: number;
  #carry: Buffer = Buffer.alloc(0);
  #held: Buffer[] = [];
  #holding = false;

  constructor(format: WireFormat) {
    this.#markers = MARKERS[format].map((m) => Buffer.from(m));
    this.#longest = Math.max(...this.#markers.map((m) => m.length));
  }

  /** What may go to the agent now. */
  push(chunk: Buffer): Buffer {
    if (this.#holding) {
      this.#held.push(chunk);
      return Buffer.alloc(0);
    }
    const data = this.#carry.length ? Buffer.concat([this.#carry, chunk]) : chunk;
    this.#carry = Buffer.alloc(0);
    let at = -1;
    for (const m of this.#markers) {
      const i = data.indexOf(m);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    }
    if (at >= 0) {
      this.#holding = true;
      this.#held.push(data.subarray(at));
      return data.subarray(0, at);
    }
    // Keep back a tail that could begin a marker.
    for (let k = Math.min(this.#longest - 1, data.length); k > 0; k--) {
      const tail = data.subarray(data.length - k);
      if (this.#markers.some((m) => m.length > k && m.subarray(0, k).equals(tail))) {
        this.#carry = Buffer.from(tail);
        return data.subarray(0, data.length - k);
      }
    }
    return data;
  }

  /** Everything held back: the final event and what followed it. */
  rest(): Buffer {
    return Buffer.concat([this.#carry, ...this.#held]);
  }
}
