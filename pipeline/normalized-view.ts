import { isAscii } from 'node:buffer';

// Evasion must not hide content (docs/decisions.md, "P7 evasion"): a key with a zero-width space in
// it, an address written with a full-width `＠` or `&commat;`, a card in full-width digits all read
// the same to whoever receives them, and not at all to a detector matching bytes. The normalized view
// is the text as a reader sees it:
//
//   view ──prefilter: all ASCII and no `&`──▶ null (the view is the input: nothing to build)
//        └▶ walk: ASCII bytes kept ─┬─ `&…;` an HTML entity ──▶ its character ──────────────┐
//                                   └─ a chunk around non-ASCII text ─▶ NFKC, only if needed ─┴─▶ invisibles dropped ─▶ view
//           (again, entities only, at most twice more while a decoded `&` can start another entity)
//
// The view is built from the bytes a detector would read otherwise (the body, or its decoded JSON
// view when escapes can hide characters), so `\u200b` inside a JSON string is decoded first and then
// dropped here. Every step is bounded per input byte, so the whole view is linear in the input:
// - an entity reads at most 32 name characters, and a numeric one its digit run (digit runs after
//   different `&` never overlap);
// - NFKC runs on chunks: the text from the ASCII letter before a non-ASCII character to the last
//   non-ASCII character, through ASCII gaps under 16 bytes, never across an `&`; cut before a starter
//   once 256 code points are gathered, and anywhere at 288. ICU reorders combining marks by
//   insertion, quadratic in a run of them: 80 KB of alternating marks took over a second in one
//   `normalize` call. Marks past 32 in a row are dropped unread (Unicode's stream-safe text, UAX #15,
//   has at most 30 non-starters in a row; only a flood has more).
//   A chunk whose every character NFKC leaves alone (CJK, most accented text) is not normalized at all;
// - a character whose compatibility form is more than twice its own UTF-8 length (U+FDFA, the squared
//   katakana words) is kept as it is, so the view is at most three times the input (twice, plus an
//   invalid UTF-8 byte in a changed chunk reading as the three bytes of U+FFFD).
// Invisible characters are Unicode's Default_Ignorable_Code_Point (zero-width space, joiners, word
// joiner, BOM, soft hyphen, variation selectors, tags, the combining grapheme joiner, the Mongolian
// vowel separator and free variation selectors, the Hangul fillers, bidi controls) plus general
// category Cf (format characters not in that set: U+0600–0605, U+06DD, U+FFF9–FFFB...). A combining
// mark left on an ASCII letter or digit after NFKC (`A\u0336K\u0336…`, strike-through text) is dropped
// too, and the hyphens U+2010–2013 and the minus sign U+2212 read as `-` (keys are spelled with
// hyphen-minus: `sk-ant-`).

/** Maps spans of a view back to the bytes they came from. */
class SpanMap {
  // Segment k covers view bytes [out[k], out[k+1]) and input bytes [src[k], src[k+1]); `same[k]` when
  // they are the same bytes (one to one), otherwise the view bytes replace the whole input span.
  #out: number[] = [0];
  #src: number[] = [0];
  #same: boolean[] = [];

  /** Appends a segment ending at view offset `outEnd` and input offset `srcEnd`. */
  push(outEnd: number, srcEnd: number, same: boolean): void {
    const k = this.#same.length - 1;
    const outStart = this.#out[this.#out.length - 1];
    const srcStart = this.#src[this.#src.length - 1];
    if (outEnd === outStart && srcEnd === srcStart) return;
    // Adjacent segments of one kind merge: the map grows with the edits, not with the input.
    if (k >= 0 && this.#same[k] === same) {
      this.#out[k + 1] = outEnd;
      this.#src[k + 1] = srcEnd;
      return;
    }
    this.#out.push(outEnd);
    this.#src.push(srcEnd);
    this.#same.push(same);
  }

  /** The input span that view bytes [start, end) came from (0 ≤ start ≤ end ≤ view length). */
  span(start: number, end: number): { start: number; end: number } {
    const out = this.#out;
    const last = out.length - 1;
    if (last === 0) return { start: 0, end: 0 };
    start = Math.max(0, Math.min(start, out[last]));
    end = Math.max(start, Math.min(end, out[last]));
    // Start: the segment holding byte `start`; end: the one holding byte `end - 1`.
    const a = this.#find(start, false);
    const s = this.#same[a] ? this.#src[a] + Math.min(start - out[a], this.#src[a + 1] - this.#src[a]) : this.#src[a];
    if (end === start) return { start: s, end: s };
    const b = this.#find(end, true);
    const e = this.#same[b] ? this.#src[b] + (end - out[b]) : this.#src[b + 1];
    return { start: s, end: Math.max(s, e) };
  }

  // The last segment k with out[k] ≤ at (or < at when `before`), clamped to a real segment.
  #find(at: number, before: boolean): number {
    const out = this.#out;
    let lo = 0;
    let hi = out.length - 2;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (before ? out[mid] < at : out[mid] <= at) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
}

export interface NormalizedView {
  /** The normalized text, UTF-8. */
  bytes: Buffer;
  /** The input span (byte offsets) that view bytes [start, end) came from. */
  span(start: number, end: number): { start: number; end: number };
}

const AMP = 0x26;
const MAX_ENTITY_NAME = 32;
const ENTITY_LEVELS = 3;
const RUN_SOFT = 256;
const RUN_HARD = 288;
const MARKS_IN_A_ROW = 32;
const GAP = 16;

/** Whether the view of these bytes can differ from them at all: one native pass each, no copy. */
export function mayNormalize(bytes: Buffer): boolean {
  return !isAscii(bytes) || bytes.indexOf(AMP) >= 0;
}

/**
 * The normalized view of `input`, or null when it would be the input itself. HTML entities are
 * decoded up to three levels (`&amp;#64;` is `&#64;` once and `@` twice: a reader told to unescape
 * keeps going), each level only where a decoded `&` remains.
 */
export function normalizedView(input: Buffer): NormalizedView | null {
  const ascii = isAscii(input);
  if (ascii && input.indexOf(AMP) < 0) return null;
  const first = pass(input, ascii, true);
  if (first === null) return null;
  const maps = [first.map];
  let bytes = first.bytes;
  for (let level = 1; level < ENTITY_LEVELS && bytes.indexOf(AMP) >= 0; level++) {
    const next = pass(bytes, true, false);
    if (next === null) break;
    maps.push(next.map);
    bytes = next.bytes;
  }
  return {
    bytes,
    span(start, end) {
      let s = { start, end };
      for (let k = maps.length - 1; k >= 0; k--) s = maps[k].span(s.start, s.end);
      return s;
    },
  };
}

/** The normalized form of a string (a secret's value, to look for it in the view). */
export function normalizeText(text: string): string {
  const view = normalizedView(Buffer.from(text, 'utf8'));
  return view === null ? text : view.bytes.toString('utf8');
}

/**
 * Text in one letter case, to match a secret whatever case it is written in: Unicode's default
 * lower-casing (String.prototype.toLowerCase, full mappings), with the final sigma read as σ (lower-
 * casing picks ς or σ by position, case folding does not). Applied alike to the needle and the view.
 */
export function caseFold(text: string): string {
  const lower = text.toLowerCase();
  return lower.indexOf('\u03c2') < 0 ? lower : lower.replaceAll('\u03c2', '\u03c3');
}

/** caseFold of a view's text; an ASCII view is read as latin1, at native speed. */
export function foldedText(view: Buffer): string {
  return isAscii(view) ? view.toString('latin1').toLowerCase() : caseFold(view.toString('utf8'));
}

// ---------- character classes ----------

const DROP = 1; // invisible: dropped
const STABLE = 2; // NFKC leaves it alone, on its own and next to anything: kept without normalizing
const STARTER = 4; // not a combining mark or a Hangul vowel/final jamo: a chunk may end before it
const EXPANDS = 16; // NFKC more than doubles its UTF-8 length (U+FDFA, squared words): kept as it is
const KNOWN = 128;

const INVISIBLE = /^[\p{Default_Ignorable_Code_Point}\p{Cf}]$/u;
const ANY_MARK = /^\p{M}$/u;
// Code points below 0x20000 (BMP and plane 1) are classified on first sight and remembered.
const classes = new Uint8Array(0x20000);

function classify(cp: number): number {
  if (cp < 0x20000) {
    const known = classes[cp];
    if (known !== 0) return known;
  } else if (cp >= 0xe0000 && cp <= 0xe0fff) {
    return KNOWN | DROP | STARTER; // tags, variation selectors supplement: default ignorable
  } else if (cp < 0x2f800 || cp > 0x2fa1f) {
    return KNOWN | STABLE | STARTER; // CJK extensions, private use: no compatibility forms
  }
  const ch = String.fromCodePoint(cp);
  let c = KNOWN;
  if (INVISIBLE.test(ch)) c |= DROP;
  const mark = ANY_MARK.test(ch);
  const jamo = (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11a8 && cp <= 0x11c2);
  if (!mark && !jamo) c |= STARTER;
  const nfkc = ch.normalize('NFKC');
  if (!(c & DROP) && !mark && !jamo && nfkc === ch && !(cp >= 0x2010 && cp <= 0x2013) && cp !== 0x2212) c |= STABLE;
  if (Buffer.byteLength(nfkc) > 2 * Buffer.byteLength(ch)) c |= EXPANDS;
  if (cp < 0x20000) classes[cp] = c;
  return c;
}

function isAsciiAlnum(b: number): boolean {
  return (b >= 0x30 && b <= 0x39) || ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a);
}

const NON_ASCII = /[^\x00-\x7f]/;
const INVISIBLES = /[\p{Default_Ignorable_Code_Point}\p{Cf}]/gu;
const LEADING_MARKS = /^[\p{Mn}\p{Me}]+/u;
const MARKS_ON_ALNUM = /([A-Za-z0-9])[\p{Mn}\p{Me}]+/gu;
const HYPHEN_LIKE = /[\u2010-\u2013\u2212]/g;

/**
 * NFKC text with invisibles dropped, marks on ASCII letters and digits dropped, hyphens folded (each a
 * native regex pass over a bounded chunk). `prevAlnum`: the character before is an ASCII letter or digit.
 */
function clean(text: string, prevAlnum: boolean): string {
  let s = text.normalize('NFKC');
  if (!NON_ASCII.test(s)) return s;
  s = s.replace(INVISIBLES, '');
  if (prevAlnum) s = s.replace(LEADING_MARKS, '');
  return s.replace(MARKS_ON_ALNUM, '$1').replace(HYPHEN_LIKE, '-');
}

// ---------- HTML entities ----------

// Windows-1252 for the C1 range, as HTML reads `&#128;`–`&#159;` (WHATWG "numeric character reference end state").
const C1 = [0x20ac, 0x81, 0x201a, 0x192, 0x201e, 0x2026, 0x2020, 0x2021, 0x2c6, 0x2030, 0x160, 0x2039, 0x152, 0x8d, 0x17d, 0x8f,
  0x90, 0x2018, 0x2019, 0x201c, 0x201d, 0x2022, 0x2013, 0x2014, 0x2dc, 0x2122, 0x161, 0x203a, 0x153, 0x9d, 0x17e, 0x178];

// The HTML5 names an attacker spells text with: every ASCII punctuation and symbol that has one, the
// spaces and invisibles, the dashes, and the letter-like mathematical letters (added below). The
// whole 2,231-name table would cost memory for characters no key, address or number is made of.
const NAMED = new Map<string, string>(Object.entries({
  excl: '!', quot: '"', QUOT: '"', num: '#', dollar: '$', percnt: '%', amp: '&', AMP: '&', apos: "'", lpar: '(', rpar: ')',
  ast: '*', midast: '*', plus: '+', comma: ',', period: '.', sol: '/', colon: ':', semi: ';', lt: '<', LT: '<', equals: '=',
  gt: '>', GT: '>', quest: '?', commat: '@', lsqb: '[', lbrack: '[', bsol: '\\', rsqb: ']', rbrack: ']', Hat: '^', lowbar: '_',
  UnderBar: '_', grave: '`', DiacriticalGrave: '`', lcub: '{', lbrace: '{', verbar: '|', vert: '|', VerticalLine: '|',
  rcub: '}', rbrace: '}', Tab: '\t', NewLine: '\n', nbsp: '\u00a0', NonBreakingSpace: '\u00a0', shy: '\u00ad',
  hyphen: '\u2010', dash: '\u2010', ndash: '\u2013', mdash: '\u2014', minus: '\u2212', horbar: '\u2015',
  ZeroWidthSpace: '\u200b', NegativeVeryThinSpace: '\u200b', NegativeThinSpace: '\u200b', NegativeMediumSpace: '\u200b',
  NegativeThickSpace: '\u200b', zwnj: '\u200c', zwj: '\u200d', lrm: '\u200e', rlm: '\u200f', NoBreak: '\u2060',
  af: '\u2061', ApplyFunction: '\u2061', it: '\u2062', InvisibleTimes: '\u2062', ic: '\u2063', InvisibleComma: '\u2063',
  ensp: '\u2002', emsp: '\u2003', emsp13: '\u2004', emsp14: '\u2005', numsp: '\u2007', puncsp: '\u2008', thinsp: '\u2009',
  ThinSpace: '\u2009', hairsp: '\u200a', VeryThinSpace: '\u200a', MediumSpace: '\u205f', lsquo: '\u2018', rsquo: '\u2019',
  ldquo: '\u201c', rdquo: '\u201d', middot: '\u00b7', centerdot: '\u00b7', bull: '\u2022', hellip: '\u2026', copy: '\u00a9',
  reg: '\u00ae', trade: '\u2122', times: '\u00d7', divide: '\u00f7', sup1: '\u00b9', sup2: '\u00b2', sup3: '\u00b3',
}));
// `&Aopf;` 𝔸, `&afr;` 𝔞, `&Ascr;` 𝒜…: all 52 letters in each style exist in HTML5, and NFKC reads each
// as its plain letter, which is what the table holds.
for (let k = 0; k < 26; k++) {
  for (const letter of [String.fromCharCode(0x41 + k), String.fromCharCode(0x61 + k)]) {
    for (const style of ['opf', 'fr', 'scr']) NAMED.set(letter + style, letter);
  }
}
// Names HTML also reads without the `;` (its legacy list), of those in the table.
const LEGACY = ['amp', 'AMP', 'lt', 'LT', 'gt', 'GT', 'quot', 'QUOT', 'nbsp', 'shy', 'copy', 'reg', 'middot', 'times', 'divide', 'sup1', 'sup2', 'sup3'];
const LEGACY_FIRST = new Uint8Array(128);
for (const name of LEGACY) LEGACY_FIRST[name.charCodeAt(0)] = 1;

function hexDigit(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  const l = b | 0x20;
  if (l >= 0x61 && l <= 0x66) return l - 0x57;
  return -1;
}

interface Entity {
  text: string;
  end: number;
}

/** The entity starting at the `&` at `at`, or null. */
function entityAt(input: Buffer, at: number): Entity | null {
  const n = input.length;
  let j = at + 1;
  if (input[j] === 0x23) {
    j++;
    const hex = input[j] === 0x78 || input[j] === 0x58;
    if (hex) j++;
    const from = j;
    let value = 0;
    for (; j < n; j++) {
      const d = hex ? hexDigit(input[j]) : input[j] >= 0x30 && input[j] <= 0x39 ? input[j] - 0x30 : -1;
      if (d < 0) break;
      value = value * (hex ? 16 : 10) + d;
      if (value > 0x10ffff) value = 0x110000; // leading zeros are fine, overflow is U+FFFD
    }
    if (j === from) return null;
    if (input[j] === 0x3b) j++;
    let cp = value;
    if (cp === 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;
    else if (cp >= 0x80 && cp <= 0x9f) cp = C1[cp - 0x80];
    return { text: String.fromCodePoint(cp), end: j };
  }
  const limit = Math.min(n, j + MAX_ENTITY_NAME);
  while (j < limit && isAsciiAlnum(input[j])) j++;
  if (j < n && input[j] === 0x3b && j > at + 1) {
    const text = NAMED.get(input.toString('latin1', at + 1, j));
    if (text !== undefined) return { text, end: j + 1 };
  }
  if (at + 1 >= n || input[at + 1] >= 0x80 || !LEGACY_FIRST[input[at + 1]]) return null;
  for (const name of LEGACY) {
    if (at + 1 + name.length > n || input[at + 1] !== name.charCodeAt(0)) continue;
    let k = 0;
    while (k < name.length && input[at + 1 + k] === name.charCodeAt(k)) k++;
    if (k === name.length) return { text: NAMED.get(name)!, end: at + 1 + k };
  }
  return null;
}

// ---------- the walk ----------

/** A growable output buffer and the map from it back to its input. */
class Writer {
  bytes: Buffer;
  length = 0;
  map = new SpanMap();
  /** Input bytes before this are written (or replaced). */
  done = 0;
  #input: Buffer;

  constructor(input: Buffer) {
    this.#input = input;
    this.bytes = Buffer.allocUnsafe(input.length + 64);
  }

  #room(extra: number): void {
    if (this.length + extra <= this.bytes.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.bytes.length * 2, this.length + extra));
    this.bytes.copy(bigger, 0, 0, this.length);
    this.bytes = bigger;
  }

  /** Copies the input up to `to` as it is. */
  keep(to: number): void {
    if (to <= this.done) return;
    this.#room(to - this.done);
    this.length += this.#input.copy(this.bytes, this.length, this.done, to);
    this.map.push(this.length, to, true);
    this.done = to;
  }

  /** Input [from, to) reads as `text`. */
  replace(from: number, to: number, text: string): void {
    this.keep(from);
    this.#room(3 * text.length);
    this.length += this.bytes.write(text, this.length, 'utf8');
    this.map.push(this.length, to, false);
    this.done = to;
  }

  /** The character before input offset `at`, as it reads in the view: is it an ASCII letter or digit? */
  alnumBefore(at: number): boolean {
    if (at > this.done) return isAsciiAlnum(this.#input[at - 1]);
    return this.length > 0 && isAsciiAlnum(this.bytes[this.length - 1]);
  }
}

/** Decodes one UTF-8 code point at `i`: (cp << 3) | length; an invalid byte reads as itself, length 1. */
function decodeAt(input: Buffer, i: number): number {
  const n = input.length;
  const b = input[i];
  if (b >= 0xc2 && b <= 0xdf && i + 1 < n && (input[i + 1] & 0xc0) === 0x80) return (((b & 0x1f) << 6) | (input[i + 1] & 0x3f)) * 8 + 2;
  if (b >= 0xe0 && b <= 0xef && i + 2 < n && (input[i + 1] & 0xc0) === 0x80 && (input[i + 2] & 0xc0) === 0x80) {
    const cp = ((b & 0x0f) << 12) | ((input[i + 1] & 0x3f) << 6) | (input[i + 2] & 0x3f);
    if (cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) return cp * 8 + 3;
  }
  if (b >= 0xf0 && b <= 0xf4 && i + 3 < n && (input[i + 1] & 0xc0) === 0x80 && (input[i + 2] & 0xc0) === 0x80 && (input[i + 3] & 0xc0) === 0x80) {
    const cp = ((b & 0x07) << 18) | ((input[i + 1] & 0x3f) << 12) | ((input[i + 2] & 0x3f) << 6) | (input[i + 3] & 0x3f);
    if (cp >= 0x10000 && cp <= 0x10ffff) return cp * 8 + 4;
  }
  return -1; // invalid: kept as a byte
}

/**
 * One level: entities decoded, and with `unicode` the non-ASCII text normalized. Null when nothing
 * changed: nothing is allocated before the first change.
 */
function pass(input: Buffer, asciiOnly: boolean, unicode: boolean): { bytes: Buffer; map: SpanMap } | null {
  const n = input.length;
  // Without non-ASCII text to normalize, only `&` can change anything.
  const ascii = asciiOnly || !unicode;
  let w: Writer | null = null;
  let i = 0;
  while (i < n) {
    if (ascii) {
      // From one `&` to the next: a short gap in this loop, a long one at memchr speed (a native call
      // per `&` of an `&` flood cost more than the rest of the walk).
      const limit = i + 16 < n ? i + 16 : n;
      while (i < limit && input[i] !== AMP) i++;
      if (i === limit) {
        i = input.indexOf(AMP, i);
        if (i < 0) break;
      }
    } else {
      const b = input[i];
      if (b < 0x80 && b !== AMP) {
        i++;
        continue;
      }
    }
    if (input[i] === AMP) {
      const e = entityAt(input, i);
      if (e === null) {
        i++;
        continue;
      }
      w ??= new Writer(input);
      let text = e.text;
      if (text.length > 1 || text.charCodeAt(0) >= 0x80) {
        text = clean(text, w.alnumBefore(i));
        if (Buffer.byteLength(text) > 2 * (e.end - i)) text = e.text;
      }
      w.replace(i, e.end, text);
      i = e.end;
      continue;
    }
    if (!unicode) {
      i++;
      continue;
    }
    // A chunk of text holding non-ASCII characters, from the ASCII letter before the first (a base
    // that marks may compose with) to the last, through ASCII gaps shorter than GAP (so accented
    // prose is one chunk, not one per accent), never across an `&`; cut before a starter once it
    // holds RUN_SOFT code points, anywhere at RUN_HARD, and before a mark past MARKS_IN_A_ROW in a row:
    // NFKC's time on it is bounded.
    const head = i > 0 && isAsciiAlnum(input[i - 1]) && (w === null || i - 1 >= w.done) ? i - 1 : i;
    let j = i;
    let last = i; // just past the last non-ASCII character of the chunk
    let count = 0;
    let marks = 0; // combining marks in a row
    let overflow = false;
    let stable = true;
    let invalid = false;
    while (j < n) {
      const b = input[j];
      if (b < 0x80) {
        if (b === AMP || j - last >= GAP || count >= RUN_SOFT) break;
        marks = 0;
        j++;
        count++;
        continue;
      }
      const d = decodeAt(input, j);
      const c = d < 0 ? KNOWN | STABLE | STARTER : classify(Math.floor(d / 8));
      marks = c & STARTER ? 0 : marks + 1;
      if (marks > MARKS_IN_A_ROW) {
        overflow = true;
        break;
      }
      if (c & EXPANDS || count >= RUN_HARD || (count >= RUN_SOFT && c & STARTER)) break;
      if (!(c & STABLE)) stable = false;
      if (d < 0) invalid = true;
      j += d < 0 ? 1 : d & 7;
      last = j;
      count++;
    }
    if (last === i) {
      i += decodeAt(input, i) & 7; // a character NFKC would blow up: kept as it is
      continue;
    }
    if (!stable) {
      const before = input.toString('utf8', head, last);
      const prevAlnum = head === i && (w === null ? i > 0 && isAsciiAlnum(input[i - 1]) : w.alnumBefore(i));
      const after = clean(before, prevAlnum);
      if (after !== before) {
        w ??= new Writer(input);
        // Only the part that changed is replaced, so what came through stays mapped to itself (not
        // when an invalid byte makes the text's UTF-8 differ from the input's).
        let p = 0;
        let s = 0;
        if (!invalid) {
          const m = Math.min(before.length, after.length);
          while (p < m && before.charCodeAt(p) === after.charCodeAt(p)) p++;
          if (p > 0 && (before.charCodeAt(p - 1) & 0xfc00) === 0xd800) p--;
          while (s < m - p && before.charCodeAt(before.length - 1 - s) === after.charCodeAt(after.length - 1 - s)) s++;
          if (s > 0 && (before.charCodeAt(before.length - s) & 0xfc00) === 0xdc00) s--;
        }
        const from = head + (p === 0 ? 0 : Buffer.byteLength(before.slice(0, p)));
        const to = last - (s === 0 ? 0 : Buffer.byteLength(before.slice(before.length - s)));
        w.replace(from, to, after.slice(p, after.length - s));
      }
    }
    i = last;
    if (overflow) {
      // Marks past MARKS_IN_A_ROW in a row are dropped unread: no script stacks that many on one
      // letter (UAX #15's stream-safe text never does), and normalizing them is all a flood would cost.
      let k = last;
      while (k < n && input[k] >= 0x80) {
        const d = decodeAt(input, k);
        if (d < 0 || classify(Math.floor(d / 8)) & STARTER) break;
        k += d & 7;
      }
      w ??= new Writer(input);
      w.replace(last, k, '');
      i = k;
    }
  }
  if (w === null) return null;
  w.keep(n);
  return { bytes: w.bytes.subarray(0, w.length), map: w.map };
}
