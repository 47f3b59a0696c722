import type { Span } from './json-view.ts';
import { copyBytes } from './shared-bytes.ts';

// An inference body split into the parts an agent resends turn after turn, for the per-part
// inspection cache (part-cache.ts, engine.ts; docs/decisions.md, "The per-part inspection cache"):
//
//   {"model":"m","system":"<prefix>…","messages":[ {…}, {…}, {…} ],"tools":[ {…} ]}
//    └──────────── skeleton ─────────────────────┘ part  part  part └─────┘ part └┘
//
// A part is exactly the bytes of one element of a top-level `messages` (Anthropic Messages, OpenAI
// Chat), `input` (OpenAI Responses) or `tools` array, or of a run of consecutive short elements of one
// (separators between them included: a group, Walk.elements). Everything else is the skeleton: the
// top level, `model`, `system` / `instructions` (where the security-context prefix lives, proxy/llm/
// steps/prefix.ts) and the separators between parts. The skeleton is the body with each
// part's bytes replaced by `null` (a long run of parts kept as its first two, `skeleton`), so skeleton
// and parts together hold every byte of the body, or for a separator dropped from such a run the same
// bytes between the same bytes: no byte escapes inspection. A body that is not a JSON object, that
// this walk cannot read, or whose parts are all short, has no parts (it is scanned whole).

/** Top-level arrays whose elements are parts. */
const PART_KEYS = ['"messages"', '"input"', '"tools"'].map((k) => Buffer.from(k));
/**
 * Elements smaller than this are grouped with their neighbours into parts of about this size: a scan's
 * fixed cost (one input, one pass per inspector) is worth paying once for several, not once each, and
 * a cache entry for a short "ok" costs more memory than it saves (docs/decisions.md, "The per-part
 * inspection cache", "Short elements in groups").
 */
export const MIN_PART_BYTES = 256;
const NULL = Buffer.from('null');

/** Parts known to start at an offset: their end (resent-parts.ts, KnownSpans; a Map will do). */
export interface KnownParts {
  get(start: number): number | undefined;
}
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * A body's parts, in body order (never overlapping); null: no parts, scan the body whole. `known`: parts
 * already found at these offsets (start → end) in an earlier body whose bytes up to each one's end are
 * this body's (resent-parts.ts checks that): the walk reaches each in the same state and reads it the
 * same, so it steps over it instead of walking it again.
 */
export function conversationParts(body: Buffer, minPartBytes = MIN_PART_BYTES, known?: KnownParts): Span[] | null {
  const walk = new Walk(body, known);
  const parts: Span[] = [];
  walk.ws();
  if (walk.at() !== 0x7b) return null;
  walk.i++;
  walk.ws();
  if (walk.at() === 0x7d) return null;
  for (;;) {
    walk.ws();
    if (walk.at() !== QUOTE) return null;
    const keyStart = walk.i;
    if (!walk.string()) return null;
    const wanted = PART_KEYS.some((k) => walk.i - keyStart === k.length && sameAt(body, keyStart, k));
    walk.ws();
    if (walk.at() !== 0x3a) return null;
    walk.i++;
    walk.ws();
    if (wanted && walk.at() === 0x5b) {
      if (!walk.elements(parts, minPartBytes)) return null;
    } else if (!walk.value()) return null;
    walk.ws();
    const c = walk.at();
    walk.i++;
    if (c === 0x2c) continue;
    if (c !== 0x7d) return null;
    walk.ws();
    // Anything after the object (a second document) is no body this walk vouches for. A body whose
    // parts are all short (a group closed by the array's end) is small: one scan of it whole costs
    // less than a skeleton and a part.
    return walk.i === body.length && parts.some((p) => p.end - p.start >= minPartBytes) ? parts : null;
  }
}

/** Whether body[at, at + k.length) is k (the caller checked the length fits). */
function sameAt(body: Buffer, at: number, k: Buffer): boolean {
  for (let j = 0; j < k.length; j++) if (body[at + j] !== k[j]) return false;
  return true;
}

/**
 * The body with each part's bytes replaced by `null`: what is scanned besides the new parts, and
 * cached by its own sha256 (engine.ts). A run of parts separated by the same separator (one comma,
 * whitespace around it) keeps its first two, `null,null`: the separators dropped with the others are
 * byte for byte the one kept, between the same two bytes (`l` and `n`), so a match inside one is a
 * match inside the kept one; and the skeleton stays the same while a conversation grows.
 */
export function skeleton(body: Buffer, parts: readonly Span[]): Buffer {
  // First pass: which parts are dropped (a bit each), and the size.
  const dropped = new Uint8Array(parts.length);
  let size = body.length;
  let run = 0;
  let gapStart = 0;
  let gapEnd = 0;
  let from = 0;
  for (let k = 0; k < parts.length; k++) {
    const p = parts[k];
    const sep = k > 0 && isSeparator(body, from, p.start);
    if (sep && run >= 2 && sameRange(body, gapStart, gapEnd, from, p.start)) {
      dropped[k] = 1;
      size -= p.end - from;
    } else {
      size -= p.end - p.start - NULL.length;
      if (sep) {
        run = 2;
        gapStart = from;
        gapEnd = p.start;
      } else run = 1;
    }
    from = p.end;
  }
  const out = Buffer.allocUnsafe(size);
  from = 0;
  let to = 0;
  for (let k = 0; k < parts.length; k++) {
    const p = parts[k];
    if (dropped[k] === 0) {
      to = copyInto(out, to, body, from, p.start);
      out[to++] = 0x6e; // null
      out[to++] = 0x75;
      out[to++] = 0x6c;
      out[to++] = 0x6c;
    }
    from = p.end;
  }
  copyInto(out, to, body, from, body.length);
  return out;
}

/** body[from, to) is whitespace around exactly one comma: two neighbouring elements of one array. */
function isSeparator(body: Buffer, from: number, to: number): boolean {
  let commas = 0;
  for (let i = from; i < to; i++) {
    const c = body[i];
    if (c === 0x2c) commas++;
    else if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return false;
  }
  return commas === 1;
}

function sameRange(body: Buffer, a: number, aEnd: number, b: number, bEnd: number): boolean {
  if (aEnd - a !== bEnd - b) return false;
  for (let j = 0; j < aEnd - a; j++) if (body[a + j] !== body[b + j]) return false;
  return true;
}

/** Copies body[from, to) to out at `at`: a loop for a few bytes (a copy call costs more), else copy(). */
function copyInto(out: Buffer, at: number, body: Buffer, from: number, to: number): number {
  if (to - from > 32) return at + copyBytes(body, out, at, from, to);
  for (let i = from; i < to; i++) out[at++] = body[i];
  return at;
}

/**
 * Several parts as one JSON array (`[a,b,c]`): new parts scanned together (engine.ts). From
 * `sharedFrom` bytes it is built in shared memory, so the pool takes it without another copy.
 */
export function group(body: Buffer, parts: readonly Span[], sharedFrom = Number.POSITIVE_INFINITY): Buffer {
  // One part alone is scanned as it is when it opens as JSON does: the views decode JSON escapes only
  // in bytes that do (json-view.ts, carriesJsonEscapes), and a group of short elements may open with a
  // number or a literal (`1,"AK\u0049A…"`), whose string's escapes would then go undecoded.
  if (parts.length === 1 && opensJson(body[parts[0].start])) return body.subarray(parts[0].start, parts[0].end);
  let size = parts.length + 1;
  for (const p of parts) size += p.end - p.start;
  const out = size >= sharedFrom ? Buffer.from(new SharedArrayBuffer(size)) : Buffer.allocUnsafe(size);
  out[0] = 0x5b;
  let to = 1;
  for (let k = 0; k < parts.length; k++) {
    if (k > 0) out[to++] = 0x2c;
    to += copyBytes(body, out, to, parts[k].start, parts[k].end);
  }
  out[to] = 0x5d;
  return out;
}

/** An object, an array or a string: bytes whose escapes the views decode (json-view.ts). */
function opensJson(b: number): boolean {
  return b === 0x7b || b === 0x5b || b === QUOTE;
}

/** A cursor over JSON bytes that skips values without building them. */
class Walk {
  i = 0;
  readonly #b: Buffer;
  readonly #n: number;
  readonly #known: KnownParts | undefined;

  constructor(body: Buffer, known?: KnownParts) {
    this.#b = body;
    this.#n = body.length;
    this.#known = known;
  }

  at(): number {
    return this.i < this.#n ? this.#b[this.i] : -1;
  }

  ws(): void {
    const b = this.#b;
    while (this.i < this.#n) {
      const c = b[this.i];
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return;
      this.i++;
    }
  }

  /** Past the string starting here (a quote); false when it never closes. */
  string(): boolean {
    const b = this.#b;
    let j = this.i + 1;
    for (;;) {
      const q = b.indexOf(QUOTE, j);
      if (q < 0) return false;
      let k = q - 1;
      let slashes = 0;
      while (k > this.i && b[k] === BACKSLASH) {
        slashes++;
        k--;
      }
      if (slashes % 2 === 0) {
        this.i = q + 1;
        return true;
      }
      j = q + 1;
    }
  }

  /** Past the value starting here; false when it is not one. */
  value(): boolean {
    const b = this.#b;
    const c = this.at();
    if (c === QUOTE) return this.string();
    if (c === 0x7b || c === 0x5b) {
      let depth = 0;
      while (this.i < this.#n) {
        const d = b[this.i];
        if (d === QUOTE) {
          if (!this.string()) return false;
          continue;
        }
        if (d === 0x7b || d === 0x5b) depth++;
        else if (d === 0x7d || d === 0x5d) {
          if (--depth === 0) {
            this.i++;
            return true;
          }
        }
        this.i++;
      }
      return false;
    }
    const from = this.i;
    while (this.i < this.#n) {
      const d = b[this.i];
      if (d === 0x2c || d === 0x7d || d === 0x5d || d === 0x20 || d === 0x0a || d === 0x0d || d === 0x09) break;
      this.i++;
    }
    return this.i > from;
  }

  /**
   * The parts of the array starting here; past the array. An element of at least `min` bytes is a part
   * of its own. Shorter ones are grouped, consecutive, into parts that close once they span `min` bytes
   * (from the first one's start to the last one's end), before an element of `min` bytes or more, or at
   * the array's end. A group's end depends only on the bytes up to it and on the element after it, so
   * a conversation that grows by short messages changes only its last group.
   *
   * A known part (`known`) is stepped over: one of `min` bytes or more is closed (a long element, or a
   * group that began with no group open); a shorter one is a group that began with none open and was
   * closed by what followed it in the earlier body, so it is left open here, as walking it would.
   */
  elements(parts: Span[], min: number): boolean {
    this.i++;
    this.ws();
    if (this.at() === 0x5d) {
      this.i++;
      return true;
    }
    let open = -1;
    let openEnd = 0;
    for (;;) {
      this.ws();
      const start = this.i;
      const end = this.#known?.get(start);
      if (end !== undefined) this.i = end;
      else if (!this.value()) return false;
      if (this.i - start >= min) {
        if (open >= 0) parts.push({ start: open, end: openEnd });
        parts.push({ start, end: this.i });
        open = -1;
      } else {
        if (open < 0) open = start;
        openEnd = this.i;
        if (openEnd - open >= min) {
          parts.push({ start: open, end: openEnd });
          open = -1;
        }
      }
      this.ws();
      const c = this.at();
      this.i++;
      if (c === 0x2c) continue;
      if (c !== 0x5d) return false;
      if (open >= 0) parts.push({ start: open, end: openEnd });
      return true;
    }
  }
}
