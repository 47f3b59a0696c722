// Byte classes shared by the hand-written detectors (ASCII only: every built-in pattern is ASCII).

export const DIGIT = 1;
export const ALPHA = 2;
export const EMAIL_LOCAL = 4; // [A-Za-z0-9._%+-]
export const EMAIL_DOMAIN = 8; // [A-Za-z0-9.-]
export const KEY_BODY = 16; // [A-Za-z0-9_-]

export const CLASS = new Uint8Array(256);
for (let b = 0x30; b <= 0x39; b++) CLASS[b] |= DIGIT | EMAIL_LOCAL | EMAIL_DOMAIN | KEY_BODY;
for (let b = 0x41; b <= 0x5a; b++) CLASS[b] |= ALPHA | EMAIL_LOCAL | EMAIL_DOMAIN | KEY_BODY;
for (let b = 0x61; b <= 0x7a; b++) CLASS[b] |= ALPHA | EMAIL_LOCAL | EMAIL_DOMAIN | KEY_BODY;
for (const c of '._%+-') CLASS[c.charCodeAt(0)] |= EMAIL_LOCAL;
for (const c of '.-') CLASS[c.charCodeAt(0)] |= EMAIL_DOMAIN;
for (const c of '_-') CLASS[c.charCodeAt(0)] |= KEY_BODY;

/**
 * The bytes no built-in detector's match holds or looks past (`, : { } [ ]` and the newline): a view may
 * be cut after one (byte-ranges.ts, normalized-windows.ts).
 */
export const SEPARATOR = new Uint8Array(256);
for (const c of ',:{}[]\n') SEPARATOR[c.charCodeAt(0)] = 1;

export function isDigit(b: number | undefined): boolean {
  return b !== undefined && b >= 0x30 && b <= 0x39;
}

export function isAlnum(b: number | undefined): boolean {
  return b !== undefined && (CLASS[b] & (DIGIT | ALPHA)) !== 0;
}

/**
 * True when the byte at `i` is the letter of a JSON escape (`\n`, `\t`, `\u`…): it follows an odd
 * run of backslashes. Scanning a body as sent, `\nAKIA…` must still put a token boundary before AKIA.
 */
export function isEscapeLetter(view: Uint8Array, i: number): boolean {
  let n = 0;
  for (let k = i - 1; k >= 0 && view[k] === 0x5c; k--) n++;
  return (n & 1) === 1;
}

/** The byte before `i` ends a word (letters, digits and `extra` bytes), unless it is an escape letter. */
export function wordBefore(view: Uint8Array, i: number, extra: readonly number[] = []): boolean {
  if (i <= 0) return false;
  const b = view[i - 1];
  if (!isAlnum(b) && !extra.includes(b)) return false;
  return !isEscapeLetter(view, i - 1);
}

/**
 * The next `byte` at or after `from`, or -1: Buffer.indexOf, which runs at memchr speed between hits
 * but costs a native call per hit. A body dense with the byte (`@@@@…`, `____…`) would pay that call
 * per byte, so the few bytes after `from` are looked at here first.
 */
export function nextByte(view: Uint8Array, byte: number, from: number): number {
  const stop = from + 32 < view.length ? from + 32 : view.length;
  for (let i = from; i < stop; i++) if (view[i] === byte) return i;
  return stop < view.length ? view.indexOf(byte, stop) : -1;
}

/** Where the run of key bytes ([A-Za-z0-9_-]) containing `i` ends. */
export function keyRunEnd(view: Uint8Array, i: number): number {
  while (i < view.length && CLASS[view[i]] & KEY_BODY) i++;
  return i;
}
