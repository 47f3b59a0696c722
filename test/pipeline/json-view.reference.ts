import { carriesJsonEscapes } from '../../pipeline/json-view.ts';

// The decoded view as it was built before P13 (a fresh copy of every byte, escapes decoded on the way,
// and three indexOf passes to tell whether escapes hide characters): the oracle the property tests
// hold the faster view to (json-view.test.ts). Kept verbatim but for the names.

const BACKSLASH = 0x5c;

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
for (const [letter, byte] of [
  [0x22, 0x22],
  [0x5c, 0x5c],
  [0x2f, 0x2f],
  [0x62, 0x08],
  [0x66, 0x0c],
  [0x6e, 0x0a],
  [0x72, 0x0d],
  [0x74, 0x09],
])
  SIMPLE[letter] = byte;

/**
 * The decoded view of a JSON body, or the body itself when nothing needs decoding (no backslash, or
 * none that starts a valid escape: then the view would be the same bytes, and a deeper level would
 * decode nothing more, so `\u` floods cost one pass, not three). Never longer than the body.
 */
export function referenceScanView(body: Buffer): Buffer {
  let i = body.indexOf(BACKSLASH);
  if (i < 0 || !carriesJsonEscapes(body)) return body;
  const n = body.length;
  const out = Buffer.allocUnsafe(n);
  let to = body.copy(out, 0, 0, i);
  let decoded = false;
  // Escapes come every few dozen bytes in real bodies (`\n` in prompts and code): a native call per gap
  // costs more than copying a short gap here, so short gaps are copied in this loop and only long ones
  // go through indexOf + copy (bench/RESULTS.md).
  for (;;) {
    // body[i] is a backslash.
    const c = i + 1 < n ? body[i + 1] : -1;
    const simple = c >= 0 ? SIMPLE[c] : -1;
    if (simple >= 0) {
      out[to++] = simple;
      i += 2;
      decoded = true;
    } else if (c === 0x75) {
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
    const limit = i + 48 < n ? i + 48 : n;
    while (i < limit) {
      const b = body[i];
      if (b === BACKSLASH) break;
      out[to++] = b;
      i++;
    }
    if (i >= n) break;
    if (body[i] === BACKSLASH) continue;
    const next = body.indexOf(BACKSLASH, i);
    if (next < 0) {
      to += body.copy(out, to, i);
      break;
    }
    to += body.copy(out, to, i, next);
    i = next;
  }
  return decoded ? out.subarray(0, to) : body;
}

const ESCAPED_UNICODE = Buffer.from('\\u');
const ESCAPED_SLASH = Buffer.from('\\/');
const ESCAPED_BACKSLASH = Buffer.from('\\\\');
const ESCAPED_BACKSPACE = Buffer.from('\\b');

/**
 * Whether escapes can hide what a detector looks for in the body as sent: `\u` escapes and `\/` spell
 * characters, and an escaped backslash `\\` starts a nested escape (JSON inside a JSON string, as
 * tool-call arguments are: `\\n` is a newline one level down, and would glue `nAKIA…` to a key),
 * and `\b` is a backspace, a control the normalized view drops (`AKIA\bIOSF…` reads as the key).
 * The other escapes stand for white space and quote characters, which detectors already treat as
 * separators in the body as sent.
 */
export function referenceHidesCharacters(body: Buffer): boolean {
  return (
    body.indexOf(ESCAPED_UNICODE) >= 0 ||
    body.indexOf(ESCAPED_SLASH) >= 0 ||
    body.indexOf(ESCAPED_BACKSLASH) >= 0 ||
    body.indexOf(ESCAPED_BACKSPACE) >= 0
  );
}

export function referenceDeepScanView(body: Buffer): Buffer {
  let view = referenceScanView(body);
  // A view that still holds a backslash may hold escapes of the next level (`\\n` became `\n`).
  for (let level = 1; level < 3 && view !== body && view.indexOf(BACKSLASH) >= 0; level++) {
    const next = referenceScanView(view);
    if (next === view) break;
    view = next;
  }
  return view;
}
