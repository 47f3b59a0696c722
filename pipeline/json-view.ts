import RE2 from 're2';
import { nextByte } from './byte-class.ts';
import { type DecodedLevel, decodeEscapes, SIMPLE_ESCAPES } from './json-escapes.ts';

// JSON escapes must not hide content (docs/decisions.md, "Inspection"): `\u0040` is an `@`, `\/` a `/`.
// A JSON (or SSE-of-JSON) body that contains a backslash is scanned through a decoded view: the same
// bytes with every valid escape replaced by the character it stands for. Structure is unchanged, so
// anything the detectors find in the body as sent they also find in the view, plus what escapes hid.
// Bodies that are not JSON are scanned as sent: a backslash in plain text is not an escape.
//
//   body ──indexOf('\\')──▶ none: scan body
//                        └▶ some: decode each escape and move the gaps down (sixteen bytes at a time,
//                           json-escapes.ts; decodeLevelScalar is the definition) ──▶ view

const BACKSLASH = 0x5c;

/** Leading whitespace is valid JSON and the sender's to choose: all of it is skipped, however long. */
function firstNonSpace(body: Uint8Array, from: number): number {
  for (let i = from; i < body.length; i++) {
    const b = body[i];
    if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) return i;
  }
  return -1;
}

const SSE_STARTS = ['data:', 'event:', 'id:', 'retry:', ':'].map((s) => Buffer.from(s));

/**
 * JSON documents and SSE streams of JSON events carry JSON string escapes; other bodies do not. A
 * UTF-8 byte order mark before them is passed over: RFC 8259 lets a parser ignore it, and some do
 * (.NET's, a browser's `Response.json()`), so `\u0041` behind one is still an `A` to some reader.
 */
export function carriesJsonEscapes(body: Buffer): boolean {
  const bom = body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf;
  const i = firstNonSpace(body, bom ? 3 : 0);
  if (i < 0) return false;
  const b = body[i];
  if (b === 0x7b || b === 0x5b || b === 0x22) return true;
  return SSE_STARTS.some((p) => body.length - i >= p.length && body.compare(p, 0, p.length, i, i + p.length) === 0);
}

const HEX = new Int8Array(256).fill(-1);
for (let b = 0; b < 256; b++) HEX[b] = hexDigit(b);

function hex(b: number): number {
  return HEX[b];
}

function hexDigit(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  if (b >= 0x41 && b <= 0x46) return b - 0x37;
  if (b >= 0x61 && b <= 0x66) return b - 0x57;
  return -1;
}

function readHex4(body: Uint8Array, at: number): number {
  if (at + 4 > body.length) return -1;
  // Digit by digit: a flood of `\u` with no digits gives up at the first byte.
  const a = hex(body[at]);
  if (a < 0) return -1;
  const b = hex(body[at + 1]),
    c = hex(body[at + 2]),
    d = hex(body[at + 3]);
  if ((b | c | d) < 0) return -1;
  return (a << 12) | (b << 8) | (c << 4) | d;
}

function writeCodePoint(out: Buffer, at: number, cp: number): number {
  if (cp < 0x80) {
    out[at] = cp;
    return at + 1;
  }
  if (cp < 0x800) {
    out[at] = 0xc0 | (cp >> 6);
    out[at + 1] = 0x80 | (cp & 0x3f);
    return at + 2;
  }
  if (cp < 0x10000) {
    out[at] = 0xe0 | (cp >> 12);
    out[at + 1] = 0x80 | ((cp >> 6) & 0x3f);
    out[at + 2] = 0x80 | (cp & 0x3f);
    return at + 3;
  }
  out[at] = 0xf0 | (cp >> 18);
  out[at + 1] = 0x80 | ((cp >> 12) & 0x3f);
  out[at + 2] = 0x80 | ((cp >> 6) & 0x3f);
  out[at + 3] = 0x80 | (cp & 0x3f);
  return at + 4;
}

// The one-letter escapes and the byte each stands for; -1 elsewhere.
const SIMPLE = new Int16Array(256).fill(-1);
for (const [letter, byte] of SIMPLE_ESCAPES) SIMPLE[letter] = byte;

/**
 * The decoded view of a JSON body, or the body itself when nothing needs decoding (no backslash, or
 * none that starts a valid escape: then the view would be the same bytes, and a deeper level would
 * decode nothing more, so `\u` floods cost one pass, not three). Never longer than the body.
 */
export function scanView(body: Buffer, jsonEscapes?: boolean, take?: Take): Buffer {
  return decodeLevel(body, { hides: false }, jsonEscapes, take);
}

/** Where a decoded level is written: a buffer of at least n bytes (scratch-buffers.ts), else a new one. */
export type Take = (n: number) => Buffer;

/**
 * One level of decoding. `walk.hides` is set when an escape the walk meets is `\u`, `\/`, `\\` or `\b`:
 * exactly when the body holds one of those pairs (hidesCharacters), since a pair the walk steps over
 * sits inside an escape that is itself `\\` or `\u`. Sixteen bytes at a time where WebAssembly SIMD
 * runs (json-escapes.ts), else decodeLevelScalar; both give the same bytes.
 */
function decodeLevel(body: Buffer, walk: { hides: boolean }, jsonEscapes?: boolean, take?: Take): Buffer {
  const i = body.indexOf(BACKSLASH);
  if (i < 0 || !(jsonEscapes ?? carriesJsonEscapes(body))) return body;
  const level = decodeEscapes(body, i, take) ?? decodeLevelScalar(body, i, take);
  walk.hides = walk.hides || level.hides;
  return level.decoded ? level.bytes : body;
}

/**
 * One level of `body`'s escapes decoded from `i`, its first backslash, in JS: the definition
 * (json-escapes.ts decodes the same, faster).
 *
 * The body is copied once, whole (one memcpy), and the gaps between escapes are then moved down in
 * place (`copyWithin`, a builtin with no wrapper, where Buffer.copy pays a JS wrapper per call): every
 * byte of `out` at or after the walk's position is still the body's byte, because the view never
 * outgrows the body. Gaps are found by indexOf after a look at the next few bytes (a run of escapes
 * back to back then costs no call per escape); gaps of a few bytes are moved by a loop, cheaper than
 * a call. Measured on the 1 MB corpus body (14,600 escapes): 1.2 ms against 2.3 ms for the copy of
 * every byte plus the three indexOf passes of hidesCharacters (docs/decisions.md).
 */
export function decodeLevelScalar(body: Buffer, i: number, take: Take = Buffer.allocUnsafe): DecodedLevel {
  const n = body.length;
  const out = take(n);
  out.set(body);
  let to = i;
  let decoded = false;
  let hides = false;
  for (;;) {
    // body[i] is a backslash.
    const c = i + 1 < n ? body[i + 1] : -1;
    const simple = c >= 0 ? SIMPLE[c] : -1;
    if (simple >= 0) {
      if (c === 0x5c || c === 0x2f || c === 0x62) hides = true;
      out[to++] = simple;
      i += 2;
      decoded = true;
    } else if (c === 0x75) {
      hides = true;
      // A `\u` flood with no hex digits gives up here, at the first byte, without a call.
      let cp = i + 2 < n && HEX[body[i + 2]] >= 0 ? readHex4(body, i + 2) : -1;
      if (cp < 0) {
        out[to++] = BACKSLASH; // not an escape: keep the bytes as sent
        i += 1;
      } else {
        let next = i + 6;
        if (cp >= 0xd800 && cp <= 0xdbff && body[next] === BACKSLASH && body[next + 1] === 0x75) {
          const lo = readHex4(body, next + 2);
          if (lo >= 0xdc00 && lo <= 0xdfff) {
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            next += 6;
          }
        }
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd; // a lone surrogate
        to = writeCodePoint(out, to, cp);
        i = next;
        decoded = true;
      }
    } else {
      out[to++] = BACKSLASH;
      i += 1;
    }
    if (i >= n) break;
    // The gap up to the next backslash (or the end), moved down to `to`.
    let end = i;
    const limit = i + 8 < n ? i + 8 : n;
    while (end < limit && body[end] !== BACKSLASH) end++;
    if (end === limit && end < n) {
      end = body.indexOf(BACKSLASH, end);
      if (end < 0) end = n;
    }
    if (end > i) {
      if (to !== i) {
        if (end - i < 16) for (let k = i; k < end; k++) out[to + k - i] = body[k];
        else out.copyWithin(to, i, end);
      }
      to += end - i;
      i = end;
    }
    if (i >= n) break;
  }
  return { bytes: out.subarray(0, to), decoded, hides };
}

export interface Span {
  start: number;
  end: number;
}

/** Where a JSON object body's top-level value of `key` lies (its last occurrence), plus the object's braces. */
export interface TopLevel {
  open: number;
  close: number;
  /** True when the object has no members. */
  empty: boolean;
  value: Span | null;
}

// One RE2 search for the pairs: its first-byte skip finds each backslash at memchr speed, where an
// indexOf per pair walked the body once each (0.21 ms against 0.56 ms on the 1 MB corpus body for three).
// `\b` is among them: a backspace is a control the normalized view drops (hidden-controls.ts).
const HIDING_ESCAPE = new RE2('\\\\[u/\\\\b]');

export function hidesCharacters(body: Buffer): boolean {
  return HIDING_ESCAPE.test(body);
}

/**
 * The view with JSON nested in JSON strings decoded too (tool-call arguments are JSON inside a JSON
 * string: `\\u0040` in the body is `\u0040` after one decode and `@` after two). At most three levels;
 * each level only shrinks the bytes. `jsonEscapes` is the whole body's when this is one byte range of
 * it (byte-ranges.ts): a range's first byte says nothing of the body's kind.
 */
export function deepScanView(body: Buffer, jsonEscapes?: boolean): Buffer {
  return decodedViews(body, jsonEscapes).decoded;
}

/** A body's decoded view, and its literal view, from one walk over its escapes. */
export interface DecodedViews {
  /** deepScanView(body). */
  decoded: Buffer;
  /** The body as sent, or `decoded` when escapes could hide a character (hidesCharacters). */
  literal: Buffer;
}

/**
 * Both views an inspection reads from a body's escapes. The first level's walk meets every escape of
 * the body, so it tells whether one hides a character on the way (decodeLevel): no second look at
 * the body. When nothing was decoded the literal view is the body whatever hidesCharacters says.
 */
export function decodedViews(body: Buffer, jsonEscapes?: boolean, take?: Take): DecodedViews {
  const walk = { hides: false };
  let view = decodeLevel(body, walk, jsonEscapes, take);
  if (view === body) return { decoded: body, literal: body };
  const literal = walk.hides ? null : body;
  // A view that still holds a backslash may hold escapes of the next level (`\\n` became `\n`).
  for (let level = 1; level < 3 && view.indexOf(BACKSLASH) >= 0; level++) {
    const next = scanView(view, jsonEscapes, take);
    if (next === view) break;
    view = next;
  }
  return { decoded: view, literal: literal ?? view };
}

/**
 * Locates the top-level value of `key` in a JSON object body without parsing the rest: strings are
 * skipped with indexOf, nested values by depth. A duplicated key reads as its last occurrence, as
 * JSON.parse, Python's json and Go's encoding/json read it: `{"model":"ok","model":"denied"}` must not
 * pass a model check that the upstream then reads differently. `null` when the body is not an object.
 * With `anyCase`, the value of every member whose key equals `key` in any letter case is pushed onto
 * it as well (Go's encoding/json matches field names that way).
 */
export function topLevel(body: Buffer, key: string, anyCase?: Span[]): TopLevel | null {
  const found = topLevelOf(body, [key], anyCase);
  return found && { open: found.open, close: found.close, empty: found.empty, value: found.values[0] };
}

// The keys callers look for are a handful of constants: each one's JSON bytes are made once.
const quotedKeys = new Map<string, Buffer>();

function quotedKey(key: string): Buffer {
  let quoted = quotedKeys.get(key);
  if (quoted === undefined) {
    quoted = Buffer.from(JSON.stringify(key), 'utf8');
    if (quotedKeys.size < 64) quotedKeys.set(key, quoted);
  }
  return quoted;
}

/** The first offset from `i` that is not JSON whitespace (the body's length when none is). */
function skipWs(body: Buffer, i: number): number {
  const n = body.length;
  while (i < n) {
    const b = body[i];
    if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) break;
    i++;
  }
  return i;
}

/** The index just past the closing quote of the string starting at `start` (a quote), or -1. */
function stringEnd(body: Buffer, start: number): number {
  let j = start + 1;
  for (;;) {
    // A key or a short value ends within a few bytes: found here, without a native call per string.
    const q = nextByte(body, 0x22, j);
    if (q < 0) return -1;
    let k = q - 1;
    let slashes = 0;
    while (k > start && body[k] === BACKSLASH) {
      slashes++;
      k--;
    }
    if (slashes % 2 === 0) return q + 1;
    j = q + 1;
  }
}

/**
 * The index just past the value starting at `i` (a string, an object or array by depth, else a run
 * up to a separator), or -1 when there is none. (Module functions, not closures over the walk's
 * position: a call of topLevelOf then allocates none.)
 */
function valueEnd(body: Buffer, i: number): number {
  const n = body.length;
  if (i >= n) return -1;
  const b = body[i];
  if (b === 0x22) return stringEnd(body, i);
  if (b === 0x7b || b === 0x5b) {
    let depth = 0;
    while (i < n) {
      const c = body[i];
      if (c === 0x22) {
        const e = stringEnd(body, i);
        if (e < 0) return -1;
        i = e;
        continue;
      }
      if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) {
        depth--;
        if (depth === 0) return i + 1;
      }
      i++;
    }
    return -1;
  }
  const from = i;
  while (i < n) {
    const c = body[i];
    if (c === 0x2c || c === 0x7d || c === 0x5d || c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) break;
    i++;
  }
  return i > from ? i : -1;
}

/** Whether the bytes at `at` are `key`'s (a short quoted key: compared here, no native call). */
function bytesAt(body: Buffer, at: number, key: Buffer): boolean {
  for (let k = 0; k < key.length; k++) if (body[at + k] !== key[k]) return false;
  return true;
}

/** The top level of a JSON object body and the value of each of `keys` (as topLevel reads one), in one walk. */
export interface TopLevelValues {
  open: number;
  close: number;
  empty: boolean;
  /** The value of each key, in the order of `keys`; null when absent. */
  values: (Span | null)[];
}

/**
 * topLevel for several keys at once: one walk of the body instead of one per key (a call reads its
 * thread, system prompt and model before the inspection). `anyCase` matches the first key only.
 */
export function topLevelOf(body: Buffer, keys: readonly string[], anyCase?: Span[]): TopLevelValues | null {
  const n = body.length;
  const quotedKeys = keys.map(quotedKey);
  const quoted = quotedKeys[0];
  const lower = anyCase ? keys[0].toLowerCase() : '';
  let i = firstNonSpace(body, 0);
  if (i < 0 || body[i] !== 0x7b) return null;
  const open = i;
  i++;
  const values: (Span | null)[] = keys.map(() => null);
  let members = 0;
  for (;;) {
    i = skipWs(body, i);
    if (i < n && body[i] === 0x7d && members === 0) return { open, close: i, empty: true, values };
    if (i >= n || body[i] !== 0x22) return null;
    const keyEnd = stringEnd(body, i);
    if (keyEnd < 0) return null;
    // A key without escapes is its own bytes: compared in place, no string made. An escaped one
    // (`"mod\\u0065l"`) is decoded first, so it is found (or told apart) as JSON.parse would.
    // Which of the keys this member's is (-1: none).
    let matches = -1;
    let matchesAnyCase = false;
    let escaped = false;
    for (let k = i + 1; k < keyEnd - 1 && !escaped; k++) escaped = body[k] === BACKSLASH;
    if (!escaped) {
      for (let q = 0; q < quotedKeys.length && matches < 0; q++) {
        const key = quotedKeys[q];
        if (keyEnd - i === key.length && bytesAt(body, i, key)) matches = q;
      }
      if (anyCase && matches !== 0 && keyEnd - i === quoted.length)
        matchesAnyCase = body.toString('utf8', i + 1, keyEnd - 1).toLowerCase() === lower;
    } else {
      let name: unknown;
      try {
        name = JSON.parse(body.toString('utf8', i, keyEnd));
      } catch {
        return null; // a key that does not parse is no object the caller can read: say so (null)
      }
      matches = keys.indexOf(name as string);
      matchesAnyCase = typeof name === 'string' && name.toLowerCase() === lower;
    }
    i = skipWs(body, keyEnd);
    if (body[i] !== 0x3a) return null;
    i = skipWs(body, i + 1);
    const valueStart = i;
    i = valueEnd(body, i);
    if (i < 0) return null;
    members++;
    if (matches >= 0) values[matches] = { start: valueStart, end: i };
    if (anyCase && (matches === 0 || matchesAnyCase)) anyCase.push({ start: valueStart, end: i });
    i = skipWs(body, i);
    if (body[i] === 0x2c) {
      i++;
      continue;
    }
    if (body[i] === 0x7d) return { open, close: i, empty: false, values };
    return null;
  }
}

/** The top-level string value of `key`, decoded; `null` when absent, not a string, or not an object body. */
export function topLevelString(body: Buffer, key: string): string | null {
  const found = topLevel(body, key);
  return found?.value ? stringAt(body, found.value) : null;
}

/** The string value at `span`, decoded; `null` when it is not a string. */
export function stringAt(body: Buffer, span: Span): string | null {
  if (body[span.start] !== 0x22) return null;
  // Printable ASCII between its quotes, no backslash and no quote: the string is those bytes, as
  // JSON.parse would read them (a model name nearly always), without decoding the span and parsing it.
  const last = span.end - 1;
  if (last > span.start && body[last] === 0x22) {
    let k = span.start + 1;
    for (; k < last; k++) {
      const b = body[k];
      if (b < 0x20 || b > 0x7e || b === 0x22 || b === 0x5c) break;
    }
    if (k === last) return body.toString('latin1', span.start + 1, last);
  }
  try {
    const v = JSON.parse(body.toString('utf8', span.start, span.end));
    return typeof v === 'string' ? v : null;
  } catch {
    return null; // not a JSON string: no value, which the caller treats as such (model: none named)
  }
}
