import { SEPARATOR } from './byte-class.ts';
import type { Finding } from './finding.ts';
import { HIDDEN_CONTROL } from './hidden-controls.ts';
import { patternReach } from './pattern-reach.ts';
import { findingKey, type InspectorFailure, type ScanResult } from './scan.ts';

export { MAX_REACH, patternReach, secretsReach } from './pattern-reach.ts';

// A large request body split across the pool by byte range (docs/decisions.md, "Splitting a large
// body by byte range"). Each worker scans one range of the one shared body; their findings are merged
// as one scan keeps them (scan.ts, `keep`).
//
//   body ─ edge e1 ──────── edge e2 ──────── …
//   range 0: [0, reach(e1))          range 1: [e1, reach(e2))          …  range N-1: [e(N-1), n)
//                  └ overlap ┘
//
// An edge is a byte position the views agree on: the byte before it is a separator (`, : { } [ ]` or a
// newline) and it starts on an ASCII byte the normalized view keeps (no hidden control). No JSON
// escape holds a separator at any level (an escape is a backslash, a letter of `"\/bfnrtu` and hex
// digits, and `\\u0041` two levels down is made of the same), no HTML entity does (a name or digits
// between `&` and `;`), and neither does a UTF-8 sequence; no combining mark attaches across it (the
// byte after is ASCII and kept). So each range's decoded and normalized
// views are exactly the whole body's views over the same span, given the whole body's lexical facts
// (ViewContext: a range's first byte says nothing of whether the body carries JSON escapes). No built-in
// detector's match holds a separator, nor looks past one (a key's body, an email's local part and
// domain, a card's digit groups all stop there), so api_key and pii find in each range exactly what
// the whole scan finds there. (`"` is no separator here: `\"` is an escape, and telling takes the
// backslashes before it, at every level.)
//
// The secrets and the custom patterns can match across an edge: each range but the last runs on past
// its edge until it has taken in 2 × max(reach, MIN_REACH) bytes that each stand for exactly one byte
// of every view (printable ASCII, no digit, none inside an escape or an entity: credits), then on to
// the next edge. A match that crosses the edge and is no longer than `reach` bytes in its view ends
// inside that overlap, however many invisible characters, escapes or entities pad it out as sent.
// A custom pattern none of whose matches can hold a separator never crosses an edge at all. One whose
// matches can be longer and hold one (`\S{6,}`), or that reads what surrounds a match where a range
// ends (`^`, `$`, `\B`, `\A`, `\z`), has no bound (patternReach): it is looked for around its literal
// in each range, and reads on over the whole body where a range cannot hold a match's window
// (patterns.ts, OpenRange). With no literal it cannot be split: the engine then splits the body by
// inspector instead, as it does a response (its joined stream text is built from every line).

export interface ByteRange {
  start: number;
  end: number;
}

/**
 * What the views of a range must know of the whole body: whether it carries JSON escapes at all
 * (json-view.ts, carriesJsonEscapes, reads that from the body's first bytes, which a range lacks).
 * Whether escapes can hide characters (hidesCharacters: the literal view is then the decoded one) is
 * each range's own: three searches of the whole body on the main thread cost more than a range's scan
 * saves, and where a range holds no `\u`, `\/`, `\\` or `\b` its raw bytes read as its decoded ones do to
 * every detector (json-view.ts, hidesCharacters; the property test holds bodies of both kinds).
 */
export interface ViewContext {
  jsonEscapes: boolean;
}

/** The fewest one-to-one bytes an overlap takes in: longer than any built-in match (keys stop at 255). */
export const MIN_REACH = 1024;
/** How far from its ideal place an edge is looked for. */
export const EDGE_SEARCH = 256 * 1024;
/** How far an overlap may run for its credits before its cut is given up. */
export const REACH_LIMIT = 1024 * 1024;
/** Bytes after a backslash that may still belong to its escape, up to three levels down (json-view.ts). */
const ESCAPE_SPAN = 32;

const BACKSLASH = 0x5c;
const AMP = 0x26;

/** Whether a range may start (or end) at `e`: see the header. */
export function isEdge(body: Uint8Array, e: number): boolean {
  return e > 0 && e < body.length && SEPARATOR[body[e - 1]] === 1 && body[e] < 0x80 && HIDDEN_CONTROL[body[e]] === 0;
}

/** The first edge in [from, to), or -1. */
export function nextEdge(body: Uint8Array, from: number, to: number): number {
  const stop = Math.min(to, body.length);
  for (let e = Math.max(from, 1); e < stop; e++) if (SEPARATOR[body[e - 1]] === 1 && isEdge(body, e)) return e;
  return -1;
}

/**
 * Where the range ending at edge `e` stops: past `credits` bytes from `e` that each stand for one byte
 * of every view, then at the next edge. -1 when that is not found within REACH_LIMIT (a body of
 * digits, escapes or non-ASCII text there: no cut at `e`).
 */
export function reachEnd(body: Uint8Array, e: number, credits: number): number {
  const limit = Math.min(body.length, e + REACH_LIMIT);
  let got = 0;
  let quiet = 0;
  let entity = false;
  let i = e;
  for (; i < limit && got < credits; i++) {
    const b = body[i];
    if (b === BACKSLASH) {
      quiet = ESCAPE_SPAN;
      continue;
    }
    if (b === AMP) {
      entity = true;
      continue;
    }
    const nameByte = (b >= 0x30 && b <= 0x39) || ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a) || b === 0x23 || b === 0x3b;
    if (entity && nameByte) continue;
    entity = false;
    if (quiet > 0) {
      quiet--;
      continue;
    }
    // Digits are never credited: an entity's digit run is one character however long it is.
    if (b >= 0x20 && b <= 0x7e && !(b >= 0x30 && b <= 0x39) && b !== 0x23 && b !== 0x3b) got++;
  }
  if (got < credits) return i >= body.length ? body.length : -1;
  if (i >= body.length) return body.length;
  const edge = nextEdge(body, i, limit);
  return edge < 0 ? (limit >= body.length ? body.length : -1) : edge;
}

/**
 * Up to `count` ranges of about equal size covering the body, or null when fewer than two can be cut
 * (the body is then scanned whole). `reach` is the longest match (view bytes) that must be found
 * across an edge.
 */
export function planRanges(body: Uint8Array, count: number, reach: number): ByteRange[] | null {
  const n = body.length;
  const edges: number[] = [];
  for (let i = 1; i < count; i++) {
    const ideal = Math.floor((i * n) / count);
    const edge = nextEdge(body, ideal, Math.min(n, ideal + EDGE_SEARCH));
    if (edge >= 0) edges.push(edge);
  }
  return rangesAt(body, edges, reach);
}

/** The ranges cut at these edges (ascending; an edge whose overlap finds no end is left out), or null. */
export function rangesAt(body: Uint8Array, edges: readonly number[], reach: number): ByteRange[] | null {
  const n = body.length;
  const credits = 2 * Math.max(reach, MIN_REACH);
  const ranges: ByteRange[] = [];
  let start = 0;
  for (const edge of edges) {
    if (edge <= start || !isEdge(body, edge)) continue;
    const end = reachEnd(body, edge, credits);
    if (end < 0) continue;
    if (end >= n) break;
    ranges.push({ start, end });
    start = edge;
  }
  if (ranges.length === 0) return null;
  ranges.push({ start, end: n });
  return ranges;
}

/** Custom patterns shared out: those each range scans (and how far they reach), those scanned whole. */
export interface PatternSplit<P extends { pattern: string }> {
  ranged: P[];
  whole: P[];
  reach: number;
}

export function splitPatterns<P extends { pattern: string }>(patterns: readonly P[]): PatternSplit<P> {
  const out: PatternSplit<P> = { ranged: [], whole: [], reach: 0 };
  for (const p of patterns) {
    const reach = patternReach(p.pattern);
    if (reach === null) out.whole.push(p);
    else {
      out.ranged.push(p);
      out.reach = Math.max(out.reach, reach);
    }
  }
  return out;
}

/**
 * The ranges' results as one scan's: findings in range order, a finding two ranges made (in their
 * overlap) kept once, as scan.ts keeps the same finding from two views; each failure once.
 */
export function mergeResults(results: readonly ScanResult[]): ScanResult {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const failures: InspectorFailure[] = [];
  const failed = new Set<string>();
  for (const r of results) {
    for (const f of r.findings) {
      const key = findingKey(f);
      if (seen.has(key)) continue;
      seen.add(key);
      findings.push(f);
    }
    for (const f of r.failures) {
      const key = `${f.inspector}\u0000${f.reason}`;
      if (failed.has(key)) continue;
      failed.add(key);
      failures.push(f);
    }
  }
  return { findings, failures };
}
