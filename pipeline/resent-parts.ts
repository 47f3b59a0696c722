import { hash } from 'node:crypto';
import type { Finding } from './finding.ts';
import type { Span } from './json-view.ts';
import type { PartCache } from './part-cache.ts';
import { copyBytes } from './shared-bytes.ts';

// Finding and keying the parts of a body an agent resends, without walking or hashing again what it
// sent before. Hashing every resent part every turn was most of a cached turn's cost: sha256 runs at
// ~300–850 MB/s here, a byte-for-byte comparison at ~20 GB/s (docs/decisions.md, "Resent parts are
// compared, not hashed again").
//
//   holder (org, agent) ─▶ its last bodies: their bytes (each shares its leading parts' bytes with the
//                          body before it, and holds a copy of the rest), parts' spans, their sha256
//   recall: the remembered body sharing the longest run of leading parts with the new one
//           (bytes [0, end of part k) equal: memcmp) ─▶ those parts' spans, for the walk to step over
//   skeleton: the same bytes as the recalled body's (memcmp) ─▶ its sha256, else sha256 now
//   hashes: part k verified above ─────────────────────────────────────────────▶ its sha256
//           same length as remembered part k and the same bytes (memcmp) ─────────▶ its sha256
//           otherwise ────────────────────────────────────────────────────────────▶ sha256 now
//   findings: a part whose sha256 is the remembered one above (the same bytes), under the same scan
//             context (part-cache.ts: policy version, secrets, inspectors, phase) ──▶ its findings, as
//             the engine learnt them for that body: no cache look-up for it, but its cache entry is
//             touched (moved to the LRU's back as a hit would be), or stored again if it was evicted
//
// A remembered span or hash is used only for bytes equal to the ones it was computed over, so the
// result is exactly what walking and hashing would give, whoever the holder is: the holder only decides
// where to look. The remembered bytes are copies, never a body the caller may reuse. Memory is capped
// (bytes of the copies), least recently used holder dropped first; each holder keeps its last
// REMEMBERED bodies (an agent's sub-conversations interleave).

const REMEMBERED = 2;
/** First parts of bodies seen first kept per holder (seenFirst), and what each counts against the cap. */
const FIRSTS = 8;
const FIRST_BYTES = 64;
/**
 * Copies of bodies seen first, taken back when they are dropped unshared, kept for the next body seen
 * first (a fresh buffer's pages are faulted in as it is written: 8 µs for 64 KB here, against 1.5
 * into one written before). At most this many, and this many bytes (an eighth of the cap at most).
 */
const SPARE_BUFFERS = 8;
const SPARE_BYTES = 8 * 1024 * 1024;
/** A remembered body is held in pieces (its leading parts shared with the body before it); past this many it is copied whole again. */
const MAX_PIECES = 32;

/** A piece of a remembered body: its bytes from `start` on. */
interface Piece {
  start: number;
  bytes: Buffer;
}

interface Remembered {
  /** The body's bytes, in order, end to end: only what was new in it is a copy of its own. */
  pieces: readonly Piece[];
  length: number;
  spans: readonly Span[];
  /**
   * Each part's sha256; empty for a body seen first, scanned whole and remembered unhashed (a later
   * body that resends its parts hashes them then).
   */
  hashes: readonly string[];
  /** The scan context the findings below hold under (part-cache.ts, context()); null: none. */
  context: string | null;
  /** Each part's findings under `context`, as the engine learnt them (undefined: not known). */
  findings: (readonly Finding[] | undefined)[];
  /** The body's skeleton (conversation-parts.ts) and its sha256, once the engine made them; null: not yet. */
  skeleton: { bytes: Buffer; hash: string } | null;
  /** Bytes counted against the cap: the body's and its skeleton's. */
  counted: number;
  /** No longer remembered (replaced by newer bodies, or its holder evicted). */
  dropped: boolean;
  /**
   * A body seen first: the copy it made of itself, taken back for another once it is dropped (#drop),
   * unless a later body shared its bytes (#remember then sets this null). Null: nothing to take back.
   */
  own: Buffer | null;
}

/**
 * Bytes compared in JavaScript before a native compare (about 0.3 µs a call): parts that differ mostly
 * differ early, past the message's own keys (`{"role":"assistant","content":[{"type":"text","text":"`).
 */
const EARLY = 64;

/** Whether a[from, from + n) and b[at, at + n) differ in their first EARLY bytes (no native call). */
function differEarly(a: Uint8Array, from: number, b: Uint8Array, at: number, n: number): boolean {
  const m = n < EARLY ? n : EARLY;
  for (let i = 0; i < m; i++) if (a[from + i] !== b[at + i]) return true;
  return false;
}

/** Whether body[from, to) is remembered's bytes over the same offsets (to ≤ both lengths). */
function sameBytes(body: Buffer, remembered: Remembered, from: number, to: number): boolean {
  for (const piece of remembered.pieces) {
    const end = piece.start + piece.bytes.length;
    if (end <= from) continue;
    if (piece.start >= to) break;
    const a = Math.max(from, piece.start);
    const b = Math.min(to, end);
    if (differEarly(body, a, piece.bytes, a - piece.start, b - a)) return false;
    if (body.compare(piece.bytes, a - piece.start, b - piece.start, a, b) !== 0) return false;
  }
  return true;
}

/** remembered's bytes over [from, from + length) equal other[start, start + length). */
function sameAt(remembered: Remembered, from: number, other: Buffer, start: number, length: number): boolean {
  for (const piece of remembered.pieces) {
    const end = piece.start + piece.bytes.length;
    if (end <= from) continue;
    if (piece.start >= from + length) break;
    const a = Math.max(from, piece.start);
    const b = Math.min(from + length, end);
    if (differEarly(other, start + (a - from), piece.bytes, a - piece.start, b - a)) return false;
    if (other.compare(piece.bytes, a - piece.start, b - piece.start, start + (a - from), start + (b - from)) !== 0)
      return false;
  }
  return true;
}

/** What is known of a new body before it is walked: its leading parts, as an earlier body had them. */
export interface Recall {
  base: Remembered;
  /** How many of base's leading parts the new body holds at the same offsets, after the same bytes. */
  verified: number;
  /** Their spans, start → end (conversationParts' `known`). */
  known: KnownSpans;
}

/**
 * The first `count` spans of a remembered body, by start: conversationParts' `known`. Read in body
 * order (a cursor, no Map built per body); a start before the last one read starts the search over.
 */
export class KnownSpans {
  readonly #spans: readonly Span[];
  readonly #count: number;
  #at = 0;

  constructor(spans: readonly Span[], count: number) {
    this.#spans = spans;
    this.#count = count;
  }

  get size(): number {
    return this.#count;
  }

  get(start: number): number | undefined {
    const spans = this.#spans;
    let i = this.#at;
    if (i > 0 && spans[i - 1].start >= start) i = 0;
    while (i < this.#count && spans[i].start < start) i++;
    this.#at = i;
    return i < this.#count && spans[i].start === start ? spans[i].end : undefined;
  }
}

/** A copy in memory of its own (Buffer.from would take a slice of the shared pool for a small one). */
function ownCopy(bytes: Buffer): Buffer {
  const copy = Buffer.allocUnsafeSlow(bytes.length);
  copyBytes(bytes, copy);
  return copy;
}

export function partHash(bytes: Uint8Array): string {
  return hash('sha256', bytes, 'base64');
}

export class ResentParts {
  #holders = new Map<string, Remembered[]>();
  /** Per holder (in #holders), the sha256 of the first part of its last FIRSTS bodies seen first. */
  #firsts = new Map<string, string[]>();
  #bytes = 0;
  #max: number;
  /** Copies given back by dropped bodies seen first (#copyOf, #giveBack), and their bytes. */
  #spare: Buffer[] = [];
  #spareBytes = 0;
  #cache: PartCache | null;

  /** `cache`: where inherited findings' entries are touched (or stored again once evicted). */
  constructor(maxBytes: number, cache: PartCache | null = null) {
    this.#max = maxBytes;
    this.#cache = cache;
  }

  /** Bytes of the spare copies kept for bodies seen first (#giveBack): at most min(8 MB, an eighth of the cap). */
  get spareBytes(): number {
    return this.#spareBytes;
  }

  /** Bytes of the remembered bodies. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Bytes of the memory the remembered bodies' pieces and skeletons hold (each whole allocation, once). */
  get retainedBytes(): number {
    const seen = new Set<ArrayBufferLike>();
    let total = 0;
    for (const bodies of this.#holders.values())
      for (const body of bodies)
        for (const bytes of [...body.pieces.map((p) => p.bytes), ...(body.skeleton ? [body.skeleton.bytes] : [])])
          if (!seen.has(bytes.buffer)) {
            seen.add(bytes.buffer);
            total += bytes.buffer.byteLength;
          }
    return total;
  }

  /** The holder's remembered body that shares the most leading parts with `body`; null: none shares one. */
  recall(holder: string | null, body: Buffer): Recall | null {
    const bodies = holder === null ? undefined : this.#holders.get(holder);
    if (bodies === undefined) return null;
    let best: Recall | null = null;
    for (const base of bodies) {
      let verified = 0;
      // The usual turn first: every remembered part leads the new body (one memcmp per piece); else
      // part by part, to find how many do.
      const last = base.spans.length > 0 ? base.spans[base.spans.length - 1].end : body.length + 1;
      if (last <= body.length && sameBytes(body, base, 0, last)) verified = base.spans.length;
      else {
        let from = 0;
        for (const span of base.spans) {
          if (span.end > body.length || !sameBytes(body, base, from, span.end)) break;
          from = span.end;
          verified++;
        }
      }
      if (verified > (best?.verified ?? 0)) best = { base, verified, known: new KnownSpans(base.spans, verified) };
      // The usual turn: the last body's parts all lead this one; no need to look further back.
      if (verified > 0 && verified === base.spans.length) break;
    }
    return best;
  }

  /**
   * The sha256 of each part of `body`, in order, and how many were reused rather than computed; the
   * body is then remembered for `holder` (null: nothing is remembered). `found`: for each part whose
   * sha256 was reused from a body remembered under the same `context`, its findings there; the caller
   * fills in the others as it learns them (a cache hit, a clean or stored scan), and the next body of
   * this holder inherits them (this array is the remembered body's own).
   */
  hashes(
    holder: string | null,
    body: Buffer,
    parts: readonly Span[],
    recall: Recall | null,
    context: string | null = null,
  ): {
    hashes: string[];
    reused: number;
    found: (readonly Finding[] | undefined)[];
    remembered: Remembered | null;
  } {
    const hashes: string[] = new Array(parts.length);
    const found: (readonly Finding[] | undefined)[] = new Array(parts.length);
    let reused = 0;
    const base = recall?.base;
    const inherit = base !== undefined && context !== null && base.context === context;
    for (let k = 0; k < parts.length; k++) {
      const { start, end } = parts[k];
      const old = base !== undefined && k < base.hashes.length ? base.spans[k] : undefined;
      if (
        old !== undefined &&
        ((k < recall!.verified && old.start === start && old.end === end) ||
          (old.end - old.start === end - start && sameAt(base!, old.start, body, start, end - start)))
      ) {
        hashes[k] = base!.hashes[k];
        if (inherit) found[k] = this.#inherit(base!.findings[k], context, hashes[k]);
        reused++;
      } else {
        hashes[k] = partHash(body.subarray(start, end));
      }
    }
    const remembered = holder === null ? null : this.#remember(holder, body, parts, hashes, recall, context, found);
    return { hashes, reused, found, remembered };
  }

  /**
   * The sha256 of a body's skeleton. A skeleton byte for byte the recalled body's (memcmp: the usual
   * turn, where only parts were added) reuses that body's sha256, as a resent part does: its head is
   * the system prompt, often the largest thing the skeleton holds, and its bytes were already compared
   * by the recall. Else it is hashed. Either way it is remembered with `remembered` (the body
   * `hashes` just remembered; null: none), counted against the cap; an unchanged one is shared, not
   * copied.
   */
  skeletonHash(recall: Recall | null, remembered: Remembered | null, skeleton: Buffer): string {
    const old = recall?.base.skeleton ?? null;
    const kept = old?.bytes.equals(skeleton) ? old : null;
    const hash = kept === null ? partHash(skeleton) : kept.hash;
    if (remembered !== null && remembered.skeleton === null && !remembered.dropped) {
      // A copy of its own (a small skeleton may be a slice of a shared pool, which it would keep alive).
      remembered.skeleton = kept ?? { bytes: ownCopy(skeleton), hash };
      remembered.counted += skeleton.length;
      this.#bytes += skeleton.length;
      this.#evict();
    }
    return hash;
  }

  /**
   * Findings a part inherits, its cache entry touched as a look-up would: an agent whose parts are
   * only ever inherited would otherwise have them evicted first under a full cache, and then scan them
   * again whenever its remembered body is gone too. An entry no longer held is looked up by its key
   * (another agent's body may have stored the same bytes since: theirs is kept, not replaced, or two
   * agents sharing a part would replace each other's entry turn after turn), else stored again (the
   * same bytes' findings under the same context: what a scan would store).
   */
  #inherit(findings: readonly Finding[] | undefined, context: string, hash: string): readonly Finding[] | undefined {
    const cache = this.#cache;
    if (findings === undefined || cache === null || cache.touch(findings)) return findings;
    const key = context + hash;
    return cache.get(key) ?? cache.set(key, findings) ?? findings;
  }

  #remember(
    holder: string,
    body: Buffer,
    parts: readonly Span[],
    hashes: string[],
    recall: Recall | null,
    context: string | null,
    findings: (readonly Finding[] | undefined)[],
  ): Remembered | null {
    if (body.length > this.#max) return null;
    // The verified leading bytes are the earlier body's pieces (equal bytes, shared, not copied); the
    // rest is copied once (a plain memcpy). The spans then index the pieces as they index the body.
    let pieces: Piece[] = [];
    let shared = 0;
    if (recall !== null && recall.verified > 0 && recall.base.pieces.length < MAX_PIECES) {
      shared = recall.base.spans[recall.verified - 1].end;
      let sharesBase = false;
      for (const piece of recall.base.pieces) {
        if (piece.start >= shared) break;
        // A piece shared whole is the same piece (its share was weighed when it was made).
        if (piece.start + piece.bytes.length <= shared) {
          pieces.push(piece);
          sharesBase = true;
          continue;
        }
        const end = Math.min(shared, piece.start + piece.bytes.length);
        const bytes = piece.bytes.subarray(0, end - piece.start);
        // A share keeps the piece's whole allocation alive, counted here only for the bytes shared: a
        // body sharing a small head of a large piece (a short turn after a long one) would hold the
        // long one's memory uncounted, turn after turn. Such a head is copied instead, into memory of
        // its own (Buffer.from would take a slice of the shared pool: its whole slab kept alive).
        const share = 2 * bytes.length >= piece.bytes.buffer.byteLength;
        pieces.push({ start: piece.start, bytes: share ? bytes : ownCopy(bytes) });
        sharesBase ||= share;
      }
      // Bytes of a body seen first shared with this one are no longer its own to give back (#drop).
      if (sharesBase) recall.base.own = null;
    }
    if (shared < body.length) {
      const copy = Buffer.allocUnsafeSlow(body.length - shared);
      copyBytes(body, copy, 0, shared);
      pieces = [...pieces, { start: shared, bytes: copy }];
    }
    const remembered: Remembered = {
      pieces,
      length: body.length,
      spans: parts,
      hashes,
      context,
      findings,
      skeleton: null,
      counted: body.length,
      dropped: false,
      own: null,
    };
    // A body remembered unhashed that this one resends is replaced by it: its verified bytes are this
    // body's first pieces, and its parts are hashed here.
    if (recall !== null && recall.verified > 0 && recall.base.hashes.length === 0) this.#forget(holder, recall.base);
    this.#keep(holder, remembered);
    return remembered;
  }

  /**
   * Whether `body`, which recall found leading with none of the holder's remembered parts, is seen
   * first: none of its parts resent. If so it is remembered unhashed (its bytes and spans: a later body
   * that resends its parts hashes them then, and they are cached from then on) and the caller scans it
   * whole; traffic that never resends pays no sha256, look-up or entry for its parts (docs/decisions.md,
   * "Only what an agent resends is cached"). Resent, though no leading part was verified:
   * - a part byte for byte the part at the same index of a remembered body (a head that changed: a
   *   system prompt that changes every turn, say);
   * - its first part anywhere in a remembered body (a window sliding over the conversation);
   * - its first part's sha256 among the first parts of the holder's last FIRSTS bodies seen first (more
   *   sub-conversations interleaved than the REMEMBERED bodies hold).
   */
  seenFirst(holder: string, body: Buffer, parts: readonly Span[]): boolean {
    if (parts.length === 0) return false;
    const head = parts[0];
    const headLength = head.end - head.start;
    for (const base of this.#holders.get(holder) ?? []) {
      for (let k = 0; k < base.spans.length; k++) {
        const old = base.spans[k];
        const length = old.end - old.start;
        if (k < parts.length) {
          const { start, end } = parts[k];
          if (length === end - start && sameAt(base, old.start, body, start, length)) return false;
        }
        if (k > 0 && length === headLength && sameAt(base, old.start, body, head.start, length)) return false;
      }
    }
    const first = partHash(body.subarray(head.start, head.end));
    const firsts = this.#firsts.get(holder);
    if (firsts?.includes(first)) return false;
    if (body.length > this.#max) return true;
    // Its first part's sha256 first, so that the one eviction below (#keep) sees every byte counted and
    // drops the holder's firsts with it if it drops the holder.
    const list = firsts ?? [];
    list.unshift(first);
    this.#bytes += FIRST_BYTES;
    if (list.length > FIRSTS) {
      list.pop();
      this.#bytes -= FIRST_BYTES;
    }
    this.#firsts.set(holder, list);
    const own = body.length > 0 ? this.#copyOf(body) : null;
    this.#keep(holder, {
      pieces: own === null ? [] : [{ start: 0, bytes: own.subarray(0, body.length) }],
      length: body.length,
      spans: parts,
      hashes: [],
      context: null,
      findings: [],
      skeleton: null,
      counted: body.length,
      dropped: false,
      own,
    });
    return true;
  }

  /** `remembered` first among its holder's bodies, the holder the most recently used. */
  #keep(holder: string, remembered: Remembered): void {
    const list = this.#holders.get(holder) ?? [];
    this.#holders.delete(holder);
    list.unshift(remembered);
    // Counted whole, though pieces are shared: the cap holds for the worst case.
    this.#bytes += remembered.length;
    while (list.length > REMEMBERED) this.#drop(list.pop()!);
    this.#holders.set(holder, list);
    this.#evict();
  }

  #forget(holder: string, body: Remembered): void {
    const list = this.#holders.get(holder);
    const at = list === undefined ? -1 : list.indexOf(body);
    if (at < 0) return;
    list!.splice(at, 1);
    this.#drop(body);
  }

  /** Least recently used holders dropped until the bytes are within the cap. */
  #evict(): void {
    for (const [oldest, bodies] of this.#holders) {
      if (this.#bytes <= this.#max) break;
      this.#holders.delete(oldest);
      for (const b of bodies) this.#drop(b);
      this.#bytes -= (this.#firsts.get(oldest)?.length ?? 0) * FIRST_BYTES;
      this.#firsts.delete(oldest);
    }
  }

  #drop(body: Remembered): void {
    this.#bytes -= body.counted;
    body.dropped = true;
    if (body.own !== null) this.#giveBack(body.own);
    body.own = null;
  }

  /**
   * A copy of `body` in memory of its own, for a body seen first: a spare one given back (the smallest
   * that holds it, at most twice its size: what it holds past the body is held uncounted), else new.
   */
  #copyOf(body: Buffer): Buffer {
    let best = -1;
    for (let k = 0; k < this.#spare.length; k++) {
      const n = this.#spare[k].length;
      if (n >= body.length && n <= 2 * body.length && (best < 0 || n < this.#spare[best].length)) best = k;
    }
    if (best < 0) return ownCopy(body);
    const copy = this.#spare[best];
    this.#spare.splice(best, 1);
    this.#spareBytes -= copy.length;
    copyBytes(body, copy);
    return copy;
  }

  /** A dropped body's own copy, kept for the next body seen first while there is room. */
  #giveBack(copy: Buffer): void {
    const room = Math.min(SPARE_BYTES, this.#max >> 3);
    if (copy.length > room) return;
    // Room is made by dropping the oldest first.
    while (this.#spare.length > 0 && (this.#spare.length >= SPARE_BUFFERS || this.#spareBytes + copy.length > room))
      this.#spareBytes -= this.#spare.shift()!.length;
    this.#spare.push(copy);
    this.#spareBytes += copy.length;
  }
}
