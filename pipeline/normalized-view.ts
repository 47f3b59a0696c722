import { isAscii } from 'node:buffer';
import { HIDDEN_CONTROL, holdsHiddenControl } from './hidden-controls.ts';

// Evasion must not hide content (docs/decisions.md, "Evasion: the normalized view"): a key with a zero-width space in
// it, an address written with a full-width `＠` or `&commat;`, a card in full-width digits all read
// the same to whoever receives them, and not at all to a detector matching bytes. The normalized view
// is the text as a reader sees it:
//
//   view ──prefilter: all ASCII, no `&`, no hidden control──▶ null (the view is the input: nothing to build)
//        └▶ one walk over code points ─┬─ ASCII byte ─────────────────────────▶ kept
//                                      ├─ a hidden control (hidden-controls.ts) ───▶ dropped
//                                      ├─ `&…;` an HTML entity ──▶ its code point ─┐
//                                      └─ a non-ASCII code point ──────────────────┴▶ its class (a table):
//             invisible ▶ dropped │ a mark after an ASCII character ▶ dropped │ other mark ▶ kept as it is
//             when nothing can compose or reorder it, composed with its starter when the pair composes, else the
//             text from its base on recomposed (NFC, in batches) │ else ▶ its own NFKC form (cached per code point)
//           (again, at most twice more from the first decoded `&`, while one can start another entity)
//
// The view is built from the bytes a detector would read otherwise (the body, or its decoded JSON
// view when escapes can hide characters), so `\u200b` inside a JSON string is decoded first and then
// dropped here. It is NFKC with three reader's rules (docs/decisions.md): invisible characters are
// dropped (the C0 and C1 controls that are not white space among them, and ANSI colour sequences); a
// combining mark on an ASCII character is dropped, decomposed first, so `é` reads as `e`
// and `A\u0301K\u0301…` as `AK…` whether or not NFKC would compose the pair; the hyphens and the
// minus sign read as `-`. NFKC is NFC of the NFKD forms of the code points, so every code point that is
// not a mark is mapped on its own, once per process (a table); Hangul jamo compose by Unicode's
// arithmetic; only marks kept on another base (Greek, Cyrillic, Indic, Thai text) may need ICU, and
// most do not (an NFC call per mark, or per invalid byte, ran at 10-20 MB/s): a mark
// that cannot compose with its starter (two tables of what composes at all) and does not reorder after
// the mark before it is kept as it is; a first mark that composes is composed by a per-pair cache; only
// the rest (a second mark that composes or reorders) recompose the text from the mark's base on, one
// NFC call per batch of up to REGION bytes, invalid bytes in it held apart by U+FDD0.
//
// Linear with a small constant on its own worst cases (bench/normalized-view.ts): a table lookup and
// a few byte writes per code point; an entity reads at most 32 name characters, or its digit run (runs
// after different `&` never overlap); an `&` that starts no entity is an ordinary byte. ICU reorders
// combining marks by insertion, quadratic in a run of them, so marks kept past 32 in a row are dropped
// (Unicode's stream-safe text, UAX #15, has at most 30 non-starters in a row; only a flood has more).
// A code point whose NFKC form is more than twice its UTF-8 length (U+FDFA, the squared katakana
// words) is kept as it is, so the view is at most twice its input. A decoded `&` makes the next entity
// level walk again only from it on. The view tells where it differs from its input (`changes`, from
// the spans the walk copied as they are), so that the normalized stage can read only around those
// places (normalized-windows.ts); no finer map back is kept (a finding has no offset, and its `match`
// is taken from the view).

export interface NormalizedView {
  /** The normalized text, UTF-8. */
  bytes: Buffer;
  /**
   * What normalization changed, in order, flat: view start, view end, input start, input end of each
   * place where the view is not the input copied as it is (a dropped character is an empty view span).
   * Outside them the view is the input, byte for byte. null when not told: a second entity level
   * changed something, or more than MAX_SPANS places.
   */
  changes: number[] | null;
}

const AMP = 0x26;
const MAX_ENTITY_NAME = 32;
const ENTITY_LEVELS = 3;
const MARKS_IN_A_ROW = 32;
/** A batch of text to recompose ends at the next starter once it is this long (bytes). */
const REGION = 65536;

/**
 * The normalized view of `input`, or null when it would be the input itself. HTML entities are
 * decoded up to three levels (`&amp;#64;` is `&#64;` once and `@` twice: a reader told to unescape
 * keeps going), a level more only while the last one decoded an `&`.
 */
export function normalizedView(input: Buffer): NormalizedView | null {
  const ascii = isAscii(input);
  const controls = holdsHiddenControl(input);
  if (ascii && !controls && input.indexOf(AMP) < 0) return null;
  // Hidden controls are dropped by the first level (a decoded `&#7;` by any): the later ones find none.
  let level = pass(input, ascii && !controls, 0, controls);
  if (level === null) return null;
  let bytes = level.bytes;
  // A later level that changes something makes them not told (their places are the first level's).
  let changes = changesOf(level.spans, bytes.length, input.length);
  for (let k = 1; k < ENTITY_LEVELS && level.firstAmp >= 0; k++) {
    // The view before the first decoded `&` is already its own view: the next level starts there
    // (a `&amp;amp;` tail does not walk a padded view twice more), from the starter before it.
    const from = levelStart(bytes, level.firstAmp);
    level = pass(bytes, isAscii(bytes.subarray(from)), from);
    if (level === null) break;
    bytes = level.bytes;
    changes = null;
  }
  return { bytes, changes };
}

/** The places a view's unchanged spans (Writer.spans) leave between them: NormalizedView.changes. */
function changesOf(spans: readonly number[] | null, viewLength: number, inputLength: number): number[] | null {
  if (spans === null) return null;
  const out: number[] = [];
  let view = 0;
  let input = 0;
  for (let k = 0; k < spans.length; k += 3) {
    const start = spans[k];
    const from = spans[k + 2];
    if (start !== view || from !== input) out.push(view, start, input, from);
    view = spans[k + 1];
    input = from + (view - start);
  }
  if (view !== viewLength || input !== inputLength) out.push(view, viewLength, input, inputLength);
  return out;
}

/**
 * Where the next level's walk starts, for a decoded `&` at `amp`: at the last character before it that
 * nothing after it composes with or sits on (an ASCII or invalid byte, a starter that is no mark or
 * Hangul jamo), so the walk there starts as the whole walk would have. Kept marks run at most 32 in a
 * row, so this looks back a few bytes; the start of the view otherwise.
 */
function levelStart(bytes: Buffer, amp: number): number {
  let p = amp;
  while (p > 0 && amp - p < 256) {
    p--;
    const b = bytes[p];
    if (b < 0x80) return p;
    if ((b & 0xc0) === 0x80) continue;
    const d = decodeAt(bytes, p);
    if (d === 0) return p;
    const cp = d >> 3;
    const c = cp < TABLE && classes[cp] !== 0 ? classes[cp] : classify(cp);
    if (!(c & (MARK | COMPOSES))) return p;
  }
  return 0;
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

// ---------- the code point table ----------

const DROP = 1; // invisible: dropped
const MARK = 2; // a combining mark (its NFKD form starts with one): dropped after an ASCII character
const COMPOSES = 4; // may compose with what precedes it: marks (recomposed by ICU), Hangul vowel and final jamo
const MAPPED = 8; // written as its mapping (the pool), not as it came
const ASCII_END = 16; // its mapping ends with an ASCII character
const AMP_IN = 32; // its mapping holds an `&` (`＆`): another entity level may be needed
const HANGUL_BASE = 64; // it ends with a Hangul initial or syllable, which a vowel or final jamo composes with
const KNOWN = 128;
const VOWEL = 256; // a Hangul vowel jamo (its mapping starts with one): a final may compose after it

// The C1 controls render as nothing too (U+0085, next line, is a line break: kept); so do the C0 controls
// and DEL that are not white space, which are ASCII and dropped by the walk (hidden-controls.ts).
const INVISIBLE = /^[\p{Default_Ignorable_Code_Point}\p{Cf}\x80-\x84\x86-\x9f]$/u;
const INVISIBLES = /[\p{Default_Ignorable_Code_Point}\p{Cf}]/gu;
const ANY_MARK = /^\p{M}/u;
const MARKS_ON_ASCII = /([\x00-\x7f])\p{M}+/gu;
const HYPHEN_LIKE = /[\u2010-\u2013\u2212]/g;
const ENDS_ASCII = /[\x00-\x7f]$/;

// Code points below TABLE are classified on first sight and remembered; their mappings are packed in
// one growing pool (a few KB for the code points real text and floods use).
const TABLE = 0x30000;
const classes = new Uint16Array(TABLE);
const mapAt = new Int32Array(TABLE);
const mapLength = new Uint8Array(TABLE);
let pool = new Uint8Array(4096);
let poolUsed = 0;

function remember(cp: number, c: number, mapping: string | null): number {
  classes[cp] = c;
  if (mapping !== null) {
    const bytes = Buffer.from(mapping, 'utf8');
    if (poolUsed + bytes.length > pool.length) {
      const bigger = new Uint8Array(pool.length * 2);
      bigger.set(pool);
      pool = bigger;
    }
    pool.set(bytes, poolUsed);
    mapAt[cp] = poolUsed;
    mapLength[cp] = bytes.length;
    poolUsed += bytes.length;
  }
  return c;
}

function classify(cp: number): number {
  if (cp >= TABLE) {
    // Tags and the variation selectors supplement are default ignorable; the rest (CJK extensions,
    // private use) has no compatibility form.
    return cp >= 0xe0000 && cp <= 0xe0fff ? KNOWN | DROP : KNOWN;
  }
  const known = classes[cp];
  if (known !== 0) return known;
  const ch = String.fromCodePoint(cp);
  if (INVISIBLE.test(ch)) return remember(cp, KNOWN | DROP, null);
  const nfkd = ch.normalize('NFKD').replace(INVISIBLES, '');
  if (nfkd === '') return remember(cp, KNOWN | DROP, null);
  const first = nfkd.codePointAt(0)!;
  // Kept as it is when its form would more than double it (U+0F77: three marks), like any character.
  const decomposed = nfkd !== ch && Buffer.byteLength(nfkd) <= 2 * Buffer.byteLength(ch);
  if (ANY_MARK.test(ch) || ANY_MARK.test(nfkd)) {
    return remember(cp, KNOWN | MARK | COMPOSES | (decomposed ? MAPPED : 0), decomposed ? nfkd : null);
  }
  if ((first >= 0x1161 && first <= 0x1175) || (first >= 0x11a8 && first <= 0x11c2)) {
    const vowel = first <= 0x1175 ? VOWEL : 0;
    return remember(cp, KNOWN | COMPOSES | vowel | (decomposed ? MAPPED : 0), decomposed ? nfkd : null);
  }
  const mapping = nfkd.replace(MARKS_ON_ASCII, '$1').replace(HYPHEN_LIKE, '-').normalize('NFC');
  // Kept as it is: what NFKC leaves alone, and what it would blow up (U+FDFA is 18 characters).
  const last = mapping.codePointAt(mapping.length - 1)!;
  const hangul = (last >= 0x1100 && last <= 0x1112) || (last >= 0xac00 && last <= 0xd7a3) ? HANGUL_BASE : 0;
  if (mapping === ch) return remember(cp, KNOWN | hangul, null);
  if (Buffer.byteLength(mapping) > 2 * Buffer.byteLength(ch)) return remember(cp, KNOWN, null);
  let c = KNOWN | MAPPED | hangul;
  if (ENDS_ASCII.test(mapping)) c |= ASCII_END;
  if (mapping.includes('&')) c |= AMP_IN;
  return remember(cp, c, mapping);
}

// Which kept marks may change when recomposed (NFC), built on the first one seen (about 15 ms): a
// mark composes only with a starter that is the first code point of some canonical decomposition or
// has one itself (FIRST), and only if it appears after the first code point of one (COMPOSER: 72 code
// points). A single mark on a starter where either is missing is left as it is: nothing can compose,
// and one mark cannot be reordered. Over-approximations both: one too many only costs an NFC call.
let FIRST: Uint8Array | null = null;
let COMPOSER: Uint8Array | null = null;

function buildComposition(): void {
  // Every composition (and what it decomposes to) is below TABLE; a code point past it reads as 0.
  const first = new Uint8Array(TABLE);
  const composer = new Uint8Array(TABLE);
  for (let cp = 0xc0; cp < TABLE; cp++) {
    if ((cp >= 0xac00 && cp <= 0xd7a3) || (cp >= 0xd800 && cp <= 0xdfff)) continue; // Hangul: by arithmetic
    const ch = String.fromCodePoint(cp);
    const nfd = ch.normalize('NFD');
    if (nfd === ch) continue;
    first[cp] = 1;
    const cps = Array.from(nfd, (c) => c.codePointAt(0)!);
    first[cps[0]] = 1;
    for (let k = 1; k < cps.length; k++) composer[cps[k]] = 1;
  }
  FIRST = first;
  COMPOSER = composer;
}

/** A starter and a mark's NFC: the code point they compose to, UNCHANGED, or OTHER. Per pair, up to a bound. */
const composedPairs = new Map<number, Map<number, number>>();
const UNCHANGED = -1;
const OTHER = -2;
// In front of each cache, a small direct-mapped one (no Map lookup for the few a text repeats).
const RECENT = 256;
const recentPair = new Int32Array(RECENT * 3).fill(-1);

function composePair(starter: number, mark: number): number {
  const slot = ((Math.imul(starter, 31) + mark) & (RECENT - 1)) * 3;
  if (recentPair[slot] === starter && recentPair[slot + 1] === mark) return recentPair[slot + 2];
  let byMark = composedPairs.get(starter);
  let composed = byMark?.get(mark);
  if (composed === undefined) {
    // Past the bound a pair is OTHER: its batch's NFC call gives the answer.
    if (cachedPairs >= MAX_PAIRS) return OTHER;
    const pair = String.fromCodePoint(starter) + String.fromCodePoint(mark);
    const nfc = pair.normalize('NFC');
    const c = nfc.codePointAt(0)!;
    composed = nfc === pair ? UNCHANGED : nfc.length === (c > 0xffff ? 2 : 1) ? c : OTHER;
    if (byMark === undefined) composedPairs.set(starter, (byMark = new Map()));
    byMark.set(mark, composed);
    cachedPairs++;
  }
  recentPair[slot] = starter;
  recentPair[slot + 1] = mark;
  recentPair[slot + 2] = composed;
  return composed;
}

/** A starter and two marks' NFC (UTF-8), or null when it is the three as they are; undefined past the bound. */
const composedTriples = new Map<number, Map<number, Map<number, Buffer | null>>>();

const recentTriple = new Int32Array(RECENT * 3).fill(-1);
const recentTripleResult: (Buffer | null)[] = new Array(RECENT).fill(null);

function composeTriple(starter: number, first: number, second: number): Buffer | null | undefined {
  const at = (Math.imul(Math.imul(starter, 31) + first, 31) + second) & (RECENT - 1);
  if (recentTriple[at * 3] === starter && recentTriple[at * 3 + 1] === first && recentTriple[at * 3 + 2] === second)
    return recentTripleResult[at];
  let byFirst = composedTriples.get(starter);
  let bySecond = byFirst?.get(first);
  let composed = bySecond?.get(second);
  if (composed === undefined) {
    if (cachedPairs >= MAX_PAIRS) return undefined;
    const text = String.fromCodePoint(starter, first, second);
    const nfc = text.normalize('NFC');
    composed = nfc === text ? null : Buffer.from(nfc, 'utf8');
    if (byFirst === undefined) composedTriples.set(starter, (byFirst = new Map()));
    if (bySecond === undefined) byFirst.set(first, (bySecond = new Map()));
    bySecond.set(second, composed);
    cachedPairs++;
  }
  recentTriple[at * 3] = starter;
  recentTriple[at * 3 + 1] = first;
  recentTriple[at * 3 + 2] = second;
  recentTripleResult[at] = composed;
  return composed;
}

/** Whether NFC puts mark `b` before mark `a` it follows (a canonical reordering), per pair, up to a bound. */
const reordered = new Map<number, Map<number, boolean>>();
/** Pairs and triples cached, all caches together: what an attacker cycling through them can make us hold. */
let cachedPairs = 0;
const MAX_PAIRS = 1 << 16;

const recentOrder = new Int32Array(RECENT * 3).fill(-1);

function reorders(a: number, b: number): boolean {
  const slot = ((Math.imul(a, 31) + b) & (RECENT - 1)) * 3;
  if (recentOrder[slot] === a && recentOrder[slot + 1] === b) return recentOrder[slot + 2] === 1;
  const r = reordersCached(a, b);
  recentOrder[slot] = a;
  recentOrder[slot + 1] = b;
  recentOrder[slot + 2] = r ? 1 : 0;
  return r;
}

function reordersCached(a: number, b: number): boolean {
  let byNext = reordered.get(a);
  let r = byNext?.get(b);
  if (r !== undefined) return r;
  // Past the bound a pair is assumed to reorder: its batch's NFC call gives the answer.
  if (cachedPairs >= MAX_PAIRS) return true;
  const pair = String.fromCodePoint(a) + String.fromCodePoint(b);
  r = pair.normalize('NFD') !== pair;
  if (byNext === undefined) reordered.set(a, (byNext = new Map()));
  byNext.set(b, r);
  cachedPairs++;
  return r;
}

/** The last code point of out[0, end) and its start as `cp * 8 + length`, or 0 when it is not valid UTF-8. */
function lastCodePoint(out: Uint8Array, end: number): number {
  let p = end - 1;
  while (p >= 0 && end - p < 4 && (out[p] & 0xc0) === 0x80) p--;
  if (p < 0) return 0;
  const d = decodeAt(out, p);
  return d !== 0 && p + (d & 7) === end ? d : 0;
}

function isAsciiAlnum(b: number): boolean {
  return (b >= 0x30 && b <= 0x39) || ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a);
}

// ---------- HTML entities ----------

// Windows-1252 for the C1 range, as HTML reads `&#128;`–`&#159;` (WHATWG "numeric character reference end state").
const C1 = [
  0x20ac, 0x81, 0x201a, 0x192, 0x201e, 0x2026, 0x2020, 0x2021, 0x2c6, 0x2030, 0x160, 0x2039, 0x152, 0x8d, 0x17d, 0x8f,
  0x90, 0x2018, 0x2019, 0x201c, 0x201d, 0x2022, 0x2013, 0x2014, 0x2dc, 0x2122, 0x161, 0x203a, 0x153, 0x9d, 0x17e, 0x178,
];

// The HTML5 names an attacker spells text with: every ASCII punctuation and symbol that has one, the
// spaces and invisibles, the dashes, and the letter-like mathematical letters (added below). The
// whole 2,231-name table would cost memory for characters no key, address or number is made of.
const NAMED_TEXT: Record<string, string> = {
  excl: '!',
  quot: '"',
  QUOT: '"',
  num: '#',
  dollar: '$',
  percnt: '%',
  amp: '&',
  AMP: '&',
  apos: "'",
  lpar: '(',
  rpar: ')',
  ast: '*',
  midast: '*',
  plus: '+',
  comma: ',',
  period: '.',
  sol: '/',
  colon: ':',
  semi: ';',
  lt: '<',
  LT: '<',
  equals: '=',
  gt: '>',
  GT: '>',
  quest: '?',
  commat: '@',
  lsqb: '[',
  lbrack: '[',
  bsol: '\\',
  rsqb: ']',
  rbrack: ']',
  Hat: '^',
  lowbar: '_',
  UnderBar: '_',
  grave: '`',
  DiacriticalGrave: '`',
  lcub: '{',
  lbrace: '{',
  verbar: '|',
  vert: '|',
  VerticalLine: '|',
  rcub: '}',
  rbrace: '}',
  Tab: '\t',
  NewLine: '\n',
  nbsp: '\u00a0',
  NonBreakingSpace: '\u00a0',
  shy: '\u00ad',
  hyphen: '\u2010',
  dash: '\u2010',
  ndash: '\u2013',
  mdash: '\u2014',
  minus: '\u2212',
  horbar: '\u2015',
  ZeroWidthSpace: '\u200b',
  NegativeVeryThinSpace: '\u200b',
  NegativeThinSpace: '\u200b',
  NegativeMediumSpace: '\u200b',
  NegativeThickSpace: '\u200b',
  zwnj: '\u200c',
  zwj: '\u200d',
  lrm: '\u200e',
  rlm: '\u200f',
  NoBreak: '\u2060',
  af: '\u2061',
  ApplyFunction: '\u2061',
  it: '\u2062',
  InvisibleTimes: '\u2062',
  ic: '\u2063',
  InvisibleComma: '\u2063',
  ensp: '\u2002',
  emsp: '\u2003',
  emsp13: '\u2004',
  emsp14: '\u2005',
  numsp: '\u2007',
  puncsp: '\u2008',
  thinsp: '\u2009',
  ThinSpace: '\u2009',
  hairsp: '\u200a',
  VeryThinSpace: '\u200a',
  MediumSpace: '\u205f',
  lsquo: '\u2018',
  rsquo: '\u2019',
  ldquo: '\u201c',
  rdquo: '\u201d',
  middot: '\u00b7',
  centerdot: '\u00b7',
  bull: '\u2022',
  hellip: '\u2026',
  copy: '\u00a9',
  reg: '\u00ae',
  trade: '\u2122',
  times: '\u00d7',
  divide: '\u00f7',
  sup1: '\u00b9',
  sup2: '\u00b2',
  sup3: '\u00b3',
};
// `&Aopf;` 𝔸, `&afr;` 𝔞, `&Ascr;` 𝒜…: all 52 letters in each style exist in HTML5, and NFKC reads each
// as its plain letter, which is what the table holds.
for (let k = 0; k < 26; k++) {
  for (const letter of [String.fromCharCode(0x41 + k), String.fromCharCode(0x61 + k)]) {
    for (const style of ['opf', 'fr', 'scr']) NAMED_TEXT[letter + style] = letter;
  }
}
// Looked up by a hash of the name's bytes, computed while reading it (no string per candidate), and
// then compared byte by byte.
const nameHash = (name: string) => {
  let h = 0;
  for (let k = 0; k < name.length; k++) h = (Math.imul(h, 31) + name.charCodeAt(k)) | 0;
  return h;
};
const NAMED = new Map<number, { name: string; cp: number }[]>();
for (const [name, text] of Object.entries(NAMED_TEXT)) {
  const h = nameHash(name);
  const list = NAMED.get(h) ?? [];
  list.push({ name, cp: text.codePointAt(0)! });
  NAMED.set(h, list);
}
// Names HTML also reads without the `;` (its legacy list), of those in the table.
const LEGACY = [
  'amp',
  'AMP',
  'lt',
  'LT',
  'gt',
  'GT',
  'quot',
  'QUOT',
  'nbsp',
  'shy',
  'copy',
  'reg',
  'middot',
  'times',
  'divide',
  'sup1',
  'sup2',
  'sup3',
];
const LEGACY_FIRST = new Uint8Array(128);
for (const name of LEGACY) LEGACY_FIRST[name.charCodeAt(0)] = 1;

function hexDigit(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  const l = b | 0x20;
  if (l >= 0x61 && l <= 0x66) return l - 0x57;
  return -1;
}

/** Just past the entity entityAt last found. */
let entityEnd = 0;

/** The code point of the entity starting at the `&` at `at` (its end in entityEnd), or -1. */
function entityAt(input: Buffer, at: number): number {
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
    if (j === from) return -1;
    if (input[j] === 0x3b) j++;
    entityEnd = j;
    if (value === 0 || value > 0x10ffff || (value >= 0xd800 && value <= 0xdfff)) return 0xfffd;
    return value >= 0x80 && value <= 0x9f ? C1[value - 0x80] : value;
  }
  const limit = Math.min(n, j + MAX_ENTITY_NAME);
  let h = 0;
  while (j < limit && isAsciiAlnum(input[j])) h = (Math.imul(h, 31) + input[j++]) | 0;
  if (j < n && input[j] === 0x3b && j > at + 1) {
    const list = NAMED.get(h);
    if (list !== undefined) {
      for (const { name, cp } of list) {
        if (name.length !== j - at - 1) continue;
        let k = 0;
        while (k < name.length && input[at + 1 + k] === name.charCodeAt(k)) k++;
        if (k === name.length) {
          entityEnd = j + 1;
          return cp;
        }
      }
    }
  }
  if (at + 1 >= n || input[at + 1] >= 0x80 || !LEGACY_FIRST[input[at + 1]]) return -1;
  for (const name of LEGACY) {
    if (at + 1 + name.length > n || input[at + 1] !== name.charCodeAt(0)) continue;
    let k = 0;
    while (k < name.length && input[at + 1 + k] === name.charCodeAt(k)) k++;
    if (k === name.length) {
      entityEnd = at + 1 + k;
      return NAMED_TEXT[name].codePointAt(0)!;
    }
  }
  return -1;
}

// ---------- the walk ----------

/** The most spans of unchanged input a view keeps track of; past it, what changed is not told. */
const MAX_SPANS = 4096;

/** The view being written: the input copied lazily, up to the next change. */
class Writer {
  bytes: Buffer;
  length = 0;
  /** Input bytes before this are written (or replaced). */
  done = 0;
  /**
   * The spans of the view copied from the input as they are, in order, flat: view start, view end,
   * input start. null past MAX_SPANS.
   */
  spans: number[] | null = [];
  readonly #input: Buffer;

  constructor(input: Buffer) {
    this.#input = input;
    // Room for the largest view (twice the input) at once: a view that grows past its input is not
    // copied again, and the pages it does not reach are never touched.
    this.bytes = Buffer.allocUnsafe(2 * input.length + 64);
  }

  room(extra: number): void {
    if (this.length + extra <= this.bytes.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.bytes.length * 2, this.length + extra));
    this.bytes.copy(bigger, 0, 0, this.length);
    this.bytes = bigger;
  }

  /** Copies the input up to `to` as it is (short spans byte by byte: a native call costs more). */
  keep(to: number): void {
    const from = this.done;
    if (to <= from) return;
    this.#kept(from, to);
    this.room(to - from);
    const input = this.#input;
    const out = this.bytes;
    if (to - from < 48) {
      let p = this.length;
      for (let k = from; k < to; k++) out[p++] = input[k];
      this.length = p;
    } else {
      this.length += input.copy(out, this.length, from, to);
    }
    this.done = to;
  }

  /** Input [from, to) is about to be copied at the view's end: one span more, or the last one longer. */
  #kept(from: number, to: number): void {
    const spans = this.spans;
    if (spans === null) return;
    const k = spans.length;
    const at = this.length;
    if (k > 0 && spans[k - 2] === at && spans[k - 1] + (at - spans[k - 3]) === from) {
      spans[k - 2] = at + (to - from);
      return;
    }
    if (k >= 3 * MAX_SPANS) {
      this.spans = null;
      return;
    }
    spans.push(at, at + (to - from), from);
  }

  /** The view is cut back to `at` (to be written again from there): spans past it are no longer kept. */
  rewind(at: number): void {
    this.length = at;
    const spans = this.spans;
    if (spans === null) return;
    let k = spans.length;
    while (k > 0 && spans[k - 2] > at) {
      if (spans[k - 3] >= at) {
        // (pop, not a shorter length: setting it costs a reallocation)
        spans.pop();
        spans.pop();
        spans.pop();
        k -= 3;
      } else spans[k - 2] = at;
    }
  }

  /** Input [from, to) is left out. */
  skip(from: number, to: number): void {
    this.keep(from);
    this.done = to;
  }

  /** Writes a code point's table mapping. */
  mapping(cp: number): void {
    const len = mapLength[cp];
    this.room(len);
    const out = this.bytes;
    let p = this.length;
    for (let k = mapAt[cp], end = k + len; k < end; k++) out[p++] = pool[k];
    this.length = p;
  }

  /** Writes a code point as UTF-8. */
  codePoint(cp: number): void {
    this.room(4);
    const out = this.bytes;
    let p = this.length;
    if (cp < 0x80) out[p++] = cp;
    else if (cp < 0x800) {
      out[p++] = 0xc0 | (cp >> 6);
      out[p++] = 0x80 | (cp & 0x3f);
    } else if (cp < 0x10000) {
      out[p++] = 0xe0 | (cp >> 12);
      out[p++] = 0x80 | ((cp >> 6) & 0x3f);
      out[p++] = 0x80 | (cp & 0x3f);
    } else {
      out[p++] = 0xf0 | (cp >> 18);
      out[p++] = 0x80 | ((cp >> 12) & 0x3f);
      out[p++] = 0x80 | ((cp >> 6) & 0x3f);
      out[p++] = 0x80 | (cp & 0x3f);
    }
    this.length = p;
  }
}

/** The code point at `i` and its UTF-8 length, as `cp * 8 + length`; 0 for an invalid byte. */
function decodeAt(input: Uint8Array, i: number): number {
  const b = input[i];
  if (b >= 0xc2 && b <= 0xdf) {
    if (i + 1 < input.length && (input[i + 1] & 0xc0) === 0x80)
      return ((((b & 0x1f) << 6) | (input[i + 1] & 0x3f)) << 3) | 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    if (i + 2 < input.length && (input[i + 1] & 0xc0) === 0x80 && (input[i + 2] & 0xc0) === 0x80) {
      const cp = ((b & 0x0f) << 12) | ((input[i + 1] & 0x3f) << 6) | (input[i + 2] & 0x3f);
      if (cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) return (cp << 3) | 3;
    }
  } else if (b >= 0xf0 && b <= 0xf4) return decode4(input, i, b);
  return 0;
}

/** decodeAt for a four-byte sequence (kept apart: a small decodeAt is inlined into the walk). */
function decode4(input: Uint8Array, i: number, b: number): number {
  if (
    i + 3 < input.length &&
    (input[i + 1] & 0xc0) === 0x80 &&
    (input[i + 2] & 0xc0) === 0x80 &&
    (input[i + 3] & 0xc0) === 0x80
  ) {
    const cp =
      ((b & 0x07) << 18) | ((input[i + 1] & 0x3f) << 12) | ((input[i + 2] & 0x3f) << 6) | (input[i + 3] & 0x3f);
    if (cp >= 0x10000 && cp <= 0x10ffff) return (cp << 3) | 4;
  }
  return 0;
}

interface Level {
  bytes: Buffer;
  /**
   * Where an entity (or `＆`) was first read as `&`, or where an `&` was left whole by a character
   * dropped after it (the next level may find another entity there), or -1.
   */
  firstAmp: number;
  /** Writer.spans. */
  spans: number[] | null;
}

/** The view offset of input offset `i` (the view is the input up to the first change). */
function viewAt(w: Writer | null, i: number): number {
  return w === null ? i : w.length + (i - w.done);
}

/** A noncharacter: a starter NFC neither moves, composes nor decomposes, standing for an invalid byte. */
const HELD = 0xfdd0;

/**
 * Recomposes (NFC) the batch of text from view offset `region` to input offset `to`, the tail of the
 * view: the marks kept in it with their bases. Returns the writer, made if the text changed. A batch
 * with invalid bytes in it (`invalid`) is read with each held by U+FDD0, which NFC leaves where it is
 * and no mark reaches across (like the byte), and the bytes are put back after: one NFC call for the
 * batch, not one per byte (a genuine U+FDD0 is held as itself).
 */
function recompose(input: Buffer, w: Writer | null, region: number, to: number, invalid: boolean): Writer | null {
  if (w !== null) w.keep(to);
  const src = w === null ? input : w.bytes;
  const end = w === null ? to : w.length;
  let held: number[] | null = null;
  let text: string;
  if (!invalid) text = src.toString('utf8', region, end);
  else {
    held = [];
    const tmp = Buffer.allocUnsafe(3 * (end - region));
    let q = 0;
    for (let p = region; p < end; ) {
      const b = src[p];
      if (b < 0x80) {
        tmp[q++] = b;
        p++;
        continue;
      }
      const d = decodeAt(src, p);
      if (d === 0 || d >> 3 === HELD) {
        held.push(d === 0 ? b : -1);
        tmp[q++] = 0xef;
        tmp[q++] = 0xb7;
        tmp[q++] = 0x90;
        p += d === 0 ? 1 : 3;
        continue;
      }
      for (let k = d & 7; k > 0; k--) tmp[q++] = src[p++];
    }
    text = tmp.toString('utf8', 0, q);
  }
  const composed = text.normalize('NFC');
  if (composed === text) return w;
  if (w === null) {
    w = new Writer(input);
    w.keep(to);
  }
  w.rewind(region);
  w.room(3 * composed.length);
  if (held === null) {
    w.length += w.bytes.write(composed, w.length, 'utf8');
    return w;
  }
  const tmp = Buffer.from(composed, 'utf8');
  const out = w.bytes;
  let p = w.length;
  let k = 0;
  for (let q = 0; q < tmp.length; ) {
    if (tmp[q] === 0xef && tmp[q + 1] === 0xb7 && tmp[q + 2] === 0x90 && held[k] >= 0) {
      out[p++] = held[k++];
      q += 3;
      continue;
    }
    if (tmp[q] === 0xef && tmp[q + 1] === 0xb7 && tmp[q + 2] === 0x90) k++;
    out[p++] = tmp[q++];
  }
  w.length = p;
  return w;
}

const ESC = 0x1b;
/** The most parameter bytes a colour sequence is read for (`38;2;255;255;255` is 16). */
const MAX_ANSI_PARAMETERS = 32;

/**
 * Past an ANSI colour (SGR, `ESC [ 1;31 m`) or erase-line (`ESC [ K`) sequence whose ESC ends at
 * `at`, or `at` when none is there. These two are what coloured tool output (grep, git, test runners)
 * is made of, and a terminal shows nothing of them. Other sequences lose only their ESC: their final
 * byte is a letter that could be part of a value, and what they show is no longer text.
 */
function ansiSequenceEnd(input: Buffer, at: number): number {
  if (input[at] !== 0x5b) return at;
  const limit = Math.min(input.length, at + 1 + MAX_ANSI_PARAMETERS);
  let j = at + 1;
  while (j < limit && ((input[j] >= 0x30 && input[j] <= 0x39) || input[j] === 0x3b || input[j] === 0x3a)) j++;
  return j < input.length && (input[j] === 0x6d || input[j] === 0x4b) ? j + 1 : at;
}

/** Runs from this many bytes on are read a word at a time (a view over the buffer's words is made). */
const WORD_RUN = 64;

/**
 * The first offset from `i` (to `n`) whose byte is not ASCII or is an `&`. A few bytes one by one,
 * then 32-bit words over the aligned part: a word holds such a byte when a high bit is set or when
 * a byte equals `&` (a zero byte of word ^ 0x26262626, the exact zero-byte test on bytes below 0x80),
 * and the byte is then found one by one within the word. Byte order does not matter: only whether
 * a word holds one, never where.
 */
function asciiRunEnd(input: Buffer, i: number, n: number): number {
  const limit = i + WORD_RUN < n ? i + WORD_RUN : n;
  for (; i < limit; i++) {
    const b = input[i];
    if (b >= 0x80 || b === AMP) return i;
  }
  if (i >= n) return n;
  const offset = input.byteOffset;
  // Bytes up to the next word boundary of the underlying memory, one by one.
  for (; i < n && ((offset + i) & 3) !== 0; i++) {
    const b = input[i];
    if (b >= 0x80 || b === AMP) return i;
  }
  const words = (n - i) >> 2;
  if (words > 0) {
    const view = new Int32Array(input.buffer, offset + i, words);
    let k = 0;
    for (; k < words; k++) {
      const w = view[k];
      const x = w ^ 0x26262626;
      if (((w | ((x - 0x01010101) & ~x)) & 0x80808080) !== 0) break;
    }
    i += k << 2;
  }
  for (; i < n; i++) {
    const b = input[i];
    if (b >= 0x80 || b === AMP) return i;
  }
  return n;
}

/**
 * asciiRunEnd when the input holds hidden controls: it stops at those too. A word may hold one when a
 * byte is below 0x20 or is 0x7f (hidden-controls.ts), and its bytes are then read one by one: slower
 * on text with line breaks, and only walked on an input that holds a hidden control.
 */
function asciiRunEndControls(input: Buffer, i: number, n: number): number {
  const offset = input.byteOffset;
  for (; i < n && ((offset + i) & 3) !== 0; i++) {
    const b = input[i];
    if (b >= 0x80 || b === AMP || HIDDEN_CONTROL[b]) return i;
  }
  const words = (n - i) >> 2;
  if (words > 0) {
    const view = new Int32Array(input.buffer, offset + i, words);
    for (let k = 0; k < words; k++) {
      const w = view[k];
      const x = w ^ 0x26262626;
      const y = w ^ 0x7f7f7f7f;
      if (((w | ((x - 0x01010101) & ~x) | ((w - 0x20202020) & ~w) | ((y - 0x01010101) & ~y)) & 0x80808080) !== 0) {
        const at = i + (k << 2);
        for (let j = at; j < at + 4; j++) {
          const b = input[j];
          if (b >= 0x80 || b === AMP || HIDDEN_CONTROL[b]) return j;
        }
      }
    }
    i += words << 2;
  }
  for (; i < n; i++) {
    const b = input[i];
    if (b >= 0x80 || b === AMP || HIDDEN_CONTROL[b]) return i;
  }
  return n;
}

/**
 * One level: entities decoded, hidden controls dropped (when `controls`: the input holds one; never
 * with `ascii`) and non-ASCII text normalized. Null when nothing changed.
 */
function pass(input: Buffer, ascii: boolean, from: number, controls = false): Level | null {
  const n = input.length;
  let w: Writer | null = null;
  let firstAmp = -1;
  // The last `&` that started no entity, in the input and in the view: a character dropped right after
  // it may leave one behind (`&\u200b#64;` reads `&#64;`), which the next level then decodes.
  let loneAmp = -1;
  let loneAmpView = -1;
  // The state after the last character handled here (ASCII bytes in between are passed over and
  // accounted for when the next one comes, at `state`):
  let state = from; // input offset the state below holds at
  let onAscii = false; // the last character written is ASCII: marks after it are dropped
  let base = from; // view offset where the last starter's text begins (what a mark recomposes with)
  let marks = 0; // marks kept in a row
  let cluster = 0; // marks kept as they are since the starter (or the composition) they sit on
  let lastMarkCp = -1; // the last of them (its last code point as written)
  let clusterFirst = false; // something in the cluster may be composed with (FIRST)
  let clusterAt = -1; // view offset of the cluster's starter, when it is one code point and its first mark one too
  let clusterStarter = 0;
  let hangul = false; // the last character can take a Hangul vowel or final jamo
  // The open batch of text to recompose (view offsets), from the base of its first mark on.
  let region = -1;
  let regionInvalid = false; // it holds an invalid byte
  let i = from;
  while (i < n) {
    if (ascii) {
      // From one `&` to the next: a short gap in this loop, a long one at memchr speed.
      const limit = i + 16 < n ? i + 16 : n;
      while (i < limit && input[i] !== AMP) i++;
      if (i === limit) {
        i = input.indexOf(AMP, i);
        if (i < 0) break;
      }
    } else {
      const b = input[i];
      if (b < 0x80 && b !== AMP && !(controls && HIDDEN_CONTROL[b] === 1)) {
        // A run of ASCII bytes with no `&`: passed over four at a time (asciiRunEnd), where one turn
        // of this loop per byte cost most of the view's time on mostly-ASCII text.
        i = controls ? asciiRunEndControls(input, i + 1, n) : asciiRunEnd(input, i + 1, n);
        continue;
      }
    }
    let cp: number;
    let end: number;
    let entity = false;
    if (input[i] === AMP) {
      // Only `&#` or `&` and a letter or digit can start one: an `&` flood costs no call per byte.
      const next = i + 1 < n ? input[i + 1] : 0;
      cp = next === 0x23 || isAsciiAlnum(next) ? entityAt(input, i) : -1;
      if (cp < 0) {
        loneAmp = i;
        loneAmpView = viewAt(w, i);
        i++; // an `&` that starts no entity is an ordinary byte
        continue;
      }
      end = entityEnd;
      entity = true;
    } else if (input[i] < 0x80) {
      // A hidden control (the only ASCII byte the walk stops at besides `&`): dropped below.
      cp = input[i];
      end = i + 1;
    } else {
      const d = decodeAt(input, i);
      if (d === 0) {
        // An invalid byte: kept as it is, a starter no mark reaches across (held apart in its batch).
        if (region >= 0) regionInvalid = true;
        i++;
        state = i;
        onAscii = false;
        marks = 0;
        cluster = 0;
        hangul = false;
        base = viewAt(w, i);
        continue;
      }
      cp = d >> 3;
      end = i + (d & 7);
    }
    if (state !== i) {
      // ASCII bytes (and `&`s that start no entity) came through since the last character handled.
      onAscii = true;
      base = viewAt(w, i - 1);
      marks = 0;
      cluster = 0;
      hangul = false;
    }
    state = end;
    if (cp < 0x80 && HIDDEN_CONTROL[cp] === 1) {
      // A hidden control, as it came or as an entity (`&#7;`): left out like an invisible character,
      // so what the next mark sits on is unchanged. An ESC that starts a colour or erase-line
      // sequence is left out with it, as a terminal shows it (`grep --color` output splits a key).
      if (cp === ESC && !entity) end = ansiSequenceEnd(input, end);
      if (firstAmp < 0 && loneAmp >= 0 && i - loneAmp <= MAX_ENTITY_NAME + 2) firstAmp = loneAmpView;
      w ??= new Writer(input);
      w.skip(i, end);
      i = end;
      continue;
    }
    if (cp < 0x80) {
      // An entity of an ASCII character.
      w ??= new Writer(input);
      w.skip(i, end);
      base = w.length;
      w.codePoint(cp);
      onAscii = true;
      if (cp === AMP && firstAmp < 0) firstAmp = base;
      marks = 0;
      cluster = 0;
      hangul = false;
      i = end;
      continue;
    }
    const known = cp < TABLE ? classes[cp] : 0;
    const c = known !== 0 ? known : classify(cp);
    if ((c & (MAPPED | DROP | MARK | COMPOSES | AMP_IN)) === MAPPED && region < 0 && !entity) {
      // A run of starters written as their table mappings (full width, compatibility forms: the bulk
      // of non-ASCII text that changes), copied in this tight loop; what ends it is handled below.
      w ??= new Writer(input);
      w.keep(i);
      const table = pool;
      let out = w.bytes;
      let p = w.length;
      let at = cp;
      let last = c;
      let start = p;
      let j = end;
      for (;;) {
        const len = mapLength[at];
        if (p + len > out.length) {
          w.length = p;
          w.room(len);
          out = w.bytes;
        }
        start = p;
        for (let k = mapAt[at], e = k + len; k < e; k++) out[p++] = table[k];
        if (j + 1 >= n) break;
        const b0 = input[j];
        const b1 = input[j + 1];
        let next: number;
        let size: number;
        if (b0 >= 0xc2 && b0 <= 0xdf && (b1 & 0xc0) === 0x80) {
          next = ((b0 & 0x1f) << 6) | (b1 & 0x3f);
          size = 2;
        } else if (b0 >= 0xe0 && b0 <= 0xef && j + 2 < n && (b1 & 0xc0) === 0x80 && (input[j + 2] & 0xc0) === 0x80) {
          next = ((b0 & 0x0f) << 12) | ((b1 & 0x3f) << 6) | (input[j + 2] & 0x3f);
          if (next < 0x800 || (next >= 0xd800 && next <= 0xdfff)) break;
          size = 3;
        } else if (b0 >= 0xf0) {
          const d = decodeAt(input, j);
          if (d === 0) break;
          next = d >> 3;
          size = d & 7;
        } else break;
        if (next >= TABLE) break;
        const nc = classes[next];
        if ((nc & (MAPPED | DROP | MARK | COMPOSES | AMP_IN)) !== MAPPED) break;
        at = next;
        last = nc;
        j += size;
      }
      w.length = p;
      w.done = j;
      base = start;
      onAscii = (last & ASCII_END) !== 0;
      hangul = (last & HANGUL_BASE) !== 0;
      marks = 0;
      cluster = 0;
      state = j;
      i = j;
      continue;
    }
    if (c & DROP || (c & MARK && (onAscii || marks >= MARKS_IN_A_ROW))) {
      // Invisible, a mark on an ASCII character, or a mark past 32 in a row: left out, and
      // what the next mark sits on is unchanged.
      if (firstAmp < 0 && loneAmp >= 0 && i - loneAmp <= MAX_ENTITY_NAME + 2) firstAmp = loneAmpView;
      w ??= new Writer(input);
      w.skip(i, end);
      i = end;
      continue;
    }
    if (c & MARK) {
      if (region < 0) {
        // No batch open: a mark is kept as it is when nothing can change it, and composed at once when
        // it composes with its starter (ICU is asked once per pair); the rest open a batch.
        if (FIRST === null) buildComposition();
        const m = c & MAPPED ? decodeAt(pool, mapAt[cp]) : (cp << 3) | (end - i);
        const written = m >> 3;
        const single = m !== 0 && (c & MAPPED ? (m & 7) === mapLength[cp] : true);
        let keep = false;
        if (cluster === 0) {
          // The first mark on its starter: it changes only if the two compose.
          if (w !== null) w.keep(i);
          const out = w === null ? input : w.bytes;
          const at = w === null ? i : w.length;
          const last = at > base ? lastCodePoint(out, at) : 0;
          const starter = last >> 3;
          const starterIsMark =
            last !== 0 && (starter < TABLE ? classes[starter] || classify(starter) : classify(starter)) & MARK;
          clusterAt = last !== 0 && !starterIsMark && single ? at - (last & 7) : -1;
          clusterStarter = starter;
          clusterFirst = last !== 0 && (FIRST![starter] === 1 || !single);
          // Nothing to compose with (an invalid byte, the start), or nothing composes: kept as it is.
          if (last === 0 || (!starterIsMark && single && !(FIRST![starter] && COMPOSER![written]))) keep = true;
          else if (!starterIsMark && single) {
            const composed = composePair(starter, written);
            if (composed === UNCHANGED) keep = true;
            else if (composed >= 0) {
              // The pair is one code point: the starter a next mark sits on (and composes with).
              if (w === null) {
                w = new Writer(input);
                w.keep(i);
              }
              w.rewind(at - (last & 7));
              w.codePoint(composed);
              w.done = end;
              marks++;
              onAscii = false;
              hangul = false;
              i = end;
              continue;
            }
          }
        } else if (
          single &&
          lastMarkCp >= 0 &&
          (!clusterFirst || !COMPOSER![written]) &&
          !reorders(lastMarkCp, written)
        ) {
          // A later mark that composes with nothing and comes in canonical order after the last: kept.
          keep = true;
        } else if (single && cluster === 1 && clusterAt >= 0 && lastMarkCp >= 0) {
          // A second mark that may compose or reorder, on a starter and one mark: their NFC, per triple.
          const composed = composeTriple(clusterStarter, lastMarkCp, written);
          if (composed === null) keep = true;
          else if (composed !== undefined) {
            if (w === null) {
              w = new Writer(input);
              w.keep(i);
            }
            w.keep(i);
            w.rewind(clusterAt);
            w.room(composed.length);
            w.length += composed.copy(w.bytes, w.length);
            w.done = end;
            marks++;
            cluster = 2;
            lastMarkCp = -1; // a third mark opens a batch
            onAscii = false;
            hangul = false;
            i = end;
            continue;
          }
        }
        if (keep) {
          cluster++;
          lastMarkCp = m === 0 ? -1 : c & MAPPED ? lastCodePoint(pool, mapAt[cp] + mapLength[cp]) >> 3 : cp;
          if (!single || FIRST![written] === 1) clusterFirst = true; // a mark that is a starter something composes with
        } else {
          region = base; // kept, and recomposed with its base in the next batch
        }
      }
      // The mark is written as it is (mapped or entity-decoded); a batch, if open, recomposes it later.
      marks++;
      if (entity || c & MAPPED) {
        w ??= new Writer(input);
        w.skip(i, end);
        if (c & MAPPED) w.mapping(cp);
        else w.codePoint(cp);
      }
      onAscii = false;
      hangul = false;
      i = end;
      continue;
    }
    if (c & COMPOSES && hangul) {
      // A Hangul vowel after an initial, or a final after a syllable without one: composed by
      // Unicode's arithmetic (UAX #15, "Hangul"), the only compositions these jamo take part in.
      const jamo =
        c & MAPPED
          ? mapLength[cp] === 3
            ? ((pool[mapAt[cp]] & 0x0f) << 12) | ((pool[mapAt[cp] + 1] & 0x3f) << 6) | (pool[mapAt[cp] + 2] & 0x3f)
            : -1
          : cp;
      // The character it follows is the view's last three bytes (Hangul is all three-byte UTF-8).
      if (w !== null) w.keep(i);
      const out = w === null ? input : w.bytes;
      const p = (w === null ? i : w.length) - 3;
      const prev = p >= 0 ? ((out[p] & 0x0f) << 12) | ((out[p + 1] & 0x3f) << 6) | (out[p + 2] & 0x3f) : -1;
      let syllable = -1;
      if (c & VOWEL && jamo >= 0x1161 && jamo <= 0x1175 && prev >= 0x1100 && prev <= 0x1112)
        syllable = 0xac00 + ((prev - 0x1100) * 21 + (jamo - 0x1161)) * 28;
      else if (jamo >= 0x11a8 && jamo <= 0x11c2 && prev >= 0xac00 && prev <= 0xd7a3 && (prev - 0xac00) % 28 === 0)
        syllable = prev + (jamo - 0x11a7);
      if (syllable >= 0) {
        if (w === null) {
          w = new Writer(input);
          w.keep(i);
        }
        w.rewind(p);
        w.codePoint(syllable);
        w.done = end;
        hangul = (syllable - 0xac00) % 28 === 0; // an LV syllable still takes a final
        i = end;
        continue;
      }
    }
    // A starter (or a Hangul vowel or final with nothing to compose with): mapped on its own.
    if (region >= 0) {
      const here = viewAt(w, i);
      if (here - region >= REGION) {
        w = recompose(input, w, region, i, regionInvalid);
        region = -1;
        regionInvalid = false;
      }
    }
    marks = 0;
    cluster = 0;
    if (entity || c & MAPPED) {
      w ??= new Writer(input);
      w.skip(i, end);
      base = w.length;
      if (c & MAPPED) w.mapping(cp);
      else w.codePoint(cp);
      onAscii = (c & ASCII_END) !== 0;
      if (c & AMP_IN && firstAmp < 0) firstAmp = base;
    } else {
      base = viewAt(w, i);
      onAscii = false;
    }
    hangul = (c & HANGUL_BASE) !== 0;
    i = end;
  }
  if (region >= 0) w = recompose(input, w, region, n, regionInvalid);
  if (w === null) return null;
  w.keep(n);
  return { bytes: w.bytes.subarray(0, w.length), firstAmp, spans: w.spans };
}
