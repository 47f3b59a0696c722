import { hash } from 'node:crypto';
import type { Span } from './json-view.ts';

// The sha256 of each conversation part (part-cache.ts keys), without hashing again what an agent
// resends. Hashing every resent part every turn was most of a cached turn's cost: sha256 runs at
// ~300–850 MB/s here, a byte-for-byte comparison at ~20 GB/s (docs/decisions.md, "Resent parts are
// compared, not hashed again").
//
//   holder (org, agent) ─▶ its last bodies: a copy of each, its parts' spans and their sha256
//   new body's part k ──── same length as remembered part k, and the same bytes (memcmp) ──▶ its sha256
//                     └─── otherwise ─────────────────────────────────────────────────────▶ sha256 now
//
// A remembered hash is reused only for bytes equal to the ones it was computed over, so the result is
// exactly what hashing would give, whoever the holder is: the holder only decides where to look. The
// bytes are copies, never a body the caller may reuse. Memory is capped (bytes of the copies), least
// recently used holder dropped first; each holder keeps its last REMEMBERED bodies (an agent's
// sub-conversations interleave).

const REMEMBERED = 2;

interface Remembered {
  bytes: Buffer;
  spans: readonly Span[];
  hashes: readonly string[];
}

export function partHash(bytes: Uint8Array): string {
  return hash('sha256', bytes, 'base64');
}

export class ResentParts {
  #holders = new Map<string, Remembered[]>();
  #bytes = 0;
  #max: number;

  constructor(maxBytes: number) {
    this.#max = maxBytes;
  }

  /** Bytes of the remembered bodies. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * The sha256 of each part of `body`, in order, and how many of them were reused; the body is then
   * remembered for `holder` (null: nothing is reused or remembered).
   */
  hashes(holder: string | null, body: Buffer, parts: readonly Span[]): { hashes: string[]; reused: number } {
    const hashes: string[] = new Array(parts.length);
    let reused = 0;
    const previous = holder === null ? undefined : this.#holders.get(holder);
    const base = previous === undefined ? undefined : closest(previous, body, parts);
    for (let k = 0; k < parts.length; k++) {
      const { start, end } = parts[k];
      const old = base !== undefined && k < base.spans.length ? base.spans[k] : undefined;
      if (
        old !== undefined &&
        old.end - old.start === end - start &&
        body.compare(base!.bytes, old.start, old.end, start, end) === 0
      ) {
        hashes[k] = base!.hashes[k];
        reused++;
      } else {
        hashes[k] = partHash(body.subarray(start, end));
      }
    }
    if (holder !== null) this.#remember(holder, previous, body, parts, hashes);
    return { hashes, reused };
  }

  #remember(
    holder: string,
    previous: Remembered[] | undefined,
    body: Buffer,
    parts: readonly Span[],
    hashes: string[],
  ): void {
    if (body.length > this.#max) return;
    const list = previous ?? [];
    this.#holders.delete(holder);
    // One copy of the body: the spans then index it as they index the body.
    list.unshift({ bytes: Buffer.from(body), spans: parts, hashes });
    this.#bytes += body.length;
    while (list.length > REMEMBERED) this.#bytes -= list.pop()!.bytes.length;
    this.#holders.set(holder, list);
    for (const [oldest, bodies] of this.#holders) {
      if (this.#bytes <= this.#max) break;
      this.#holders.delete(oldest);
      for (const b of bodies) this.#bytes -= b.bytes.length;
    }
  }
}

/** The remembered body whose first part is the new body's first part (the same conversation), if any. */
function closest(bodies: readonly Remembered[], body: Buffer, parts: readonly Span[]): Remembered | undefined {
  if (parts.length === 0) return undefined;
  const { start, end } = parts[0];
  for (const b of bodies) {
    const first = b.spans[0];
    if (first !== undefined && first.end - first.start === end - start) {
      if (body.compare(b.bytes, first.start, first.end, start, end) === 0) return b;
    }
  }
  return undefined;
}
