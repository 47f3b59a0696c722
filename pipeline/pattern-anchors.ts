import RE2 from 're2';
import { AnchorUnsupportedError } from './errors.ts';
import { findNeedle, MAX_NEEDLE, type Needle, needleProblem, needleSearch } from './literal-search.ts';

// A custom pattern's anchor: a literal every one of its matches contains, and how far a match can
// reach on either side of it (docs/decisions.md, "Custom patterns located by their literals").
//
//   pattern  \b[a-z0-9-]+\.corp\.example\.com\b      anchor `.corp.example.com`
//            └ before: unbounded, only [a-z0-9-] ┘   after: 0 bytes
//
//   view ──locate(anchor)──▶ hits ──▶ windows: [hit − before, hit end + after], cut before the hit
//        where a byte the prefix cannot hold stands, after it where the suffix's language dies; merged
//        ──▶ the real pattern runs in each window only (exec from the window's start, the text cut one
//        byte past its end).
//
// Exact, not a heuristic: every match of the whole view contains an occurrence of the anchor and lies
// inside that occurrence's window, so inside one merged window; a run over a window starts with the
// bytes before it as context (re2 reads `\b` across lastIndex) and sees one byte past it, so each
// window yields exactly the whole view's matches there, in the same order (the proof in the decision).
//
// The parse is conservative and deliberately partial: a top-level sequence of literals, classes,
// escapes and groups with quantifiers, under an optional leading flag group. Anything else (a
// top-level `|`, a flag group later on, `\Q`, back references, octal) gives no anchor, and the pattern
// runs over the whole view as before. Byte counts are upper bounds (4 bytes for a character that may
// be non-ASCII), and byte alphabets are supersets (every byte ≥ 0x80 once a class or case folding can
// reach beyond ASCII): an overestimate only widens a window.

export interface Anchor {
  /** The literal's alternatives (one, or those of a group of plain literals), as UTF-8. */
  literals: Buffer[];
  /**
   * Case-insensitive: the literal is located under the pattern's own folding, by the SIMD search and
   * the reading around it (`folded`) or by re2 (`locators`).
   */
  fold: boolean;
  /**
   * re2 per literal (fold only): it folds as the pattern does (`k` also finds the Kelvin sign). One
   * each, not one alternation: at a place where several alternatives match, each one's end starts a
   * window of its own (`(?i)(?:abc|ab)[c-d]:` on `abc:`: the match goes through `ab`, its `c` read by
   * the class, and the window after `abc` alone would end before `:`).
   */
  locators: RE2[];
  /**
   * Per literal (fold only): its SIMD search (literal-search.ts), or null where re2 alone finds it
   * (no SIMD here, a byte outside ASCII, no run of two bytes without `k` or `s`).
   */
  folded: (FoldedPlan | null)[];
  /**
   * Per literal (case-sensitive only): its SIMD search where Buffer.indexOf's pivot byte is common in
   * agent traffic (simdNeedle), else null.
   */
  needles: (Needle | null)[];
  /** The literals as one re2 source (folded as the pattern folds): a member of the patterns' RE2.Set. */
  source: string;
  /** Per literal: where Buffer.indexOf looks for it from (case-sensitive only; pivotOf). */
  pivots: number[];
  /** The most bytes a match holds before the literal / after it (Infinity: unbounded). */
  before: number;
  after: number;
  /** The bytes a match may hold before the literal. */
  prefixBytes: Uint8Array;
  /**
   * What follows the literal, element by element: the bytes each may hold, and whether it must hold
   * one (its minimum is not 0). Read as `bytes{required ? 1 : 0,}` each, a language holding every
   * match's rest, so where it dies no match reaches (windows).
   */
  suffix: { bytes: Uint8Array[]; required: boolean[] };
  /** What locating costs, in units of one re2 pass over the view (plan-time guess, see LOCATOR_COST). */
  cost: number;
}

/**
 * A folded literal found by its longest run without `k` or `s` (literal-search.ts), sixteen starts at
 * a time. When the run is the whole literal its starts are the literal's; else the rest of the literal
 * is read around each run found, as re2 folds it (foldedAround).
 */
export interface FoldedPlan {
  needle: Needle;
  /** The run is the whole literal. */
  exact: boolean;
  /** The literal's characters before the run and after it, lower case (read by foldedAround). */
  head: Uint8Array;
  tail: Uint8Array;
}

const ALL = new Uint8Array(256).fill(1);
const HIGH = new Uint8Array(256);
for (let b = 0x80; b < 256; b++) HIGH[b] = 1;
/**
 * Every ASCII letter: what a non-ASCII character may also match under case folding (re2 folds U+212A
 * to `k` and U+017F to `s`; taking all letters keeps the superset safe whatever else folds to ASCII).
 */
const ASCII_LETTERS = new Uint8Array(256);
for (let b = 0x41; b <= 0x7a; b++) if (b <= 0x5a || b >= 0x61) ASCII_LETTERS[b] = 1;

function bytesOf(codes: Iterable<number>): Uint8Array {
  const out = new Uint8Array(256);
  for (const c of codes) out[c] = 1;
  return out;
}
function range(from: number, to: number): number[] {
  const out: number[] = [];
  for (let c = from; c <= to; c++) out.push(c);
  return out;
}
function union(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(256);
  for (let i = 0; i < 256; i++) out[i] = a[i] | b[i];
  return out;
}
function hasHigh(a: Uint8Array): boolean {
  for (let i = 0x80; i < 256; i++) if (a[i]) return true;
  return false;
}
function complement(a: Uint8Array): Uint8Array {
  // A negated class matches every character outside it, non-ASCII ones included.
  const out = new Uint8Array(256);
  for (let i = 0; i < 128; i++) out[i] = a[i] ? 0 : 1;
  for (let i = 128; i < 256; i++) out[i] = 1;
  return out;
}
const DIGITS = bytesOf(range(0x30, 0x39));
const WORD = bytesOf([...range(0x30, 0x39), ...range(0x41, 0x5a), ...range(0x61, 0x7a), 0x5f]);
// re2's \s: [\t\n\f\r ] (ASCII; no \v).
const SPACE = bytesOf([0x09, 0x0a, 0x0c, 0x0d, 0x20]);

/** One element of a sequence, after its quantifier. */
interface Atom {
  min: number;
  max: number;
  bytes: Uint8Array;
  /** The code point when the atom is exactly one literal character (no quantifier). */
  char: number | null;
  /** The alternatives when the atom is a group of plain literal strings (no quantifier). */
  alts: string[] | null;
}

const LITERAL_ESCAPES: Record<string, number> = { n: 0x0a, t: 0x09, r: 0x0d, f: 0x0c, v: 0x0b, a: 0x07 };

function utf8Length(cp: number): number {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

function isAsciiLetter(cp: number): boolean {
  return (cp >= 0x41 && cp <= 0x5a) || (cp >= 0x61 && cp <= 0x7a);
}

/** A recursive-descent reader of the subset of re2 syntax described in the header. */
class Parser {
  #src: string;
  #i = 0;
  #fold: boolean;

  constructor(src: string, start: number, fold: boolean) {
    this.#src = src;
    this.#i = start;
    this.#fold = fold;
  }

  get done(): boolean {
    return this.#i >= this.#src.length;
  }

  /** Alternatives of sequences up to `)` or the end. */
  alternation(): Atom[][] {
    const alts: Atom[][] = [this.sequence()];
    while (this.#src[this.#i] === '|') {
      this.#i++;
      alts.push(this.sequence());
    }
    return alts;
  }

  sequence(): Atom[] {
    const atoms: Atom[] = [];
    while (this.#i < this.#src.length && this.#src[this.#i] !== '|' && this.#src[this.#i] !== ')') {
      const atom = this.#atom();
      atoms.push(this.#quantified(atom));
    }
    return atoms;
  }

  #quantified(atom: Atom): Atom {
    const c = this.#src[this.#i];
    let min = 1;
    let max = 1;
    if (c === '*' || c === '+' || c === '?') {
      this.#i++;
      min = c === '+' ? 1 : 0;
      max = c === '?' ? 1 : Infinity;
    } else if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(this.#src.slice(this.#i, this.#i + 24));
      if (!m) return atom; // a literal `{`: read as an atom next
      this.#i += m[0].length;
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === '' ? Infinity : Number(m[3]);
    } else return atom;
    if (this.#src[this.#i] === '?') this.#i++; // lazy: the same language
    const next = this.#src[this.#i];
    if (next === '*' || next === '+' || next === '?') throw new AnchorUnsupportedError('repeated quantifier');
    return {
      min: atom.min * min,
      max: atom.max === 0 ? 0 : max === Infinity ? Infinity : atom.max * max,
      bytes: max === 0 ? new Uint8Array(256) : atom.bytes,
      char: null,
      alts: null,
    };
  }

  #literal(cp: number): Atom {
    const len = utf8Length(cp);
    const bytes = bytesOf(Buffer.from(String.fromCodePoint(cp), 'utf8'));
    if (this.#fold && (isAsciiLetter(cp) || cp >= 0x80)) {
      // Folding reaches other cases, and beyond ASCII (`k` ~ U+212A, `s` ~ U+017F) and back into it
      // (U+017F matches `s`: a non-ASCII character may stand for an ASCII letter).
      if (isAsciiLetter(cp)) bytes[cp ^ 0x20] = 1;
      const reach = cp >= 0x80 ? union(HIGH, ASCII_LETTERS) : HIGH;
      return { min: 1, max: 4, bytes: union(bytes, reach), char: cp, alts: null };
    }
    return { min: len, max: len, bytes, char: cp, alts: null };
  }

  #class(bytes: Uint8Array, maxLength: number): Atom {
    return { min: 1, max: maxLength, bytes, char: null, alts: null };
  }

  #empty(): Atom {
    return { min: 0, max: 0, bytes: new Uint8Array(256), char: null, alts: null };
  }

  #atom(): Atom {
    const src = this.#src;
    const c = src[this.#i];
    if (c === '(') return this.#group();
    if (c === '[') return this.#bracket();
    if (c === '.') {
      this.#i++;
      return this.#class(ALL, 4);
    }
    if (c === '^' || c === '$') {
      this.#i++;
      return this.#empty();
    }
    if (c === '*' || c === '+' || c === '?') throw new AnchorUnsupportedError('quantifier without an atom');
    if (c === '\\') return this.#escape();
    const cp = src.codePointAt(this.#i)!;
    this.#i += cp > 0xffff ? 2 : 1;
    return this.#literal(cp);
  }

  #group(): Atom {
    const src = this.#src;
    this.#i++; // (
    if (src[this.#i] === '?') {
      const named = /^\?P?<[A-Za-z_][A-Za-z0-9_]*>/.exec(src.slice(this.#i, this.#i + 64));
      if (named) this.#i += named[0].length;
      else if (src[this.#i + 1] === ':') this.#i += 2;
      else throw new AnchorUnsupportedError('flags inside the pattern');
    }
    const alts = this.alternation();
    if (src[this.#i] !== ')') throw new AnchorUnsupportedError('unbalanced group');
    this.#i++;
    let min = Infinity;
    let max = 0;
    let bytes: Uint8Array = new Uint8Array(256);
    for (const seq of alts) {
      min = Math.min(
        min,
        seq.reduce((n, a) => n + a.min, 0),
      );
      max = Math.max(
        max,
        seq.reduce((n, a) => n + a.max, 0),
      );
      for (const a of seq) bytes = union(bytes, a.bytes);
    }
    const plain = alts.every((seq) => seq.length > 0 && seq.every((a) => a.char !== null));
    if (alts.length === 1 && alts[0].length === 1) return alts[0][0]; // `(x)`: the atom itself
    return {
      min,
      max,
      bytes,
      char: null,
      alts: plain ? alts.map((seq) => seq.map((a) => String.fromCodePoint(a.char!)).join('')) : null,
    };
  }

  /** An escape outside a class. */
  #escape(): Atom {
    const src = this.#src;
    const e = src[this.#i + 1];
    if (e === undefined) throw new AnchorUnsupportedError('trailing backslash');
    this.#i += 2;
    switch (e) {
      case 'd':
        return this.#class(DIGITS, 1);
      case 'D':
        return this.#class(complement(DIGITS), 4);
      case 'w':
        return this.#class(this.#foldBytes(WORD), this.#fold ? 4 : 1);
      case 'W':
        return this.#class(complement(WORD), 4);
      case 's':
        return this.#class(SPACE, 1);
      case 'S':
        return this.#class(complement(SPACE), 4);
      case 'b':
      case 'B':
      case 'A':
      case 'z':
        return this.#empty();
      case 'C':
        return this.#class(ALL, 1);
      case 'p':
      case 'P':
        this.#skipProperty();
        return this.#class(ALL, 4);
      case 'x':
        return this.#literal(this.#hexEscape());
    }
    if (e in LITERAL_ESCAPES) return this.#literal(LITERAL_ESCAPES[e]);
    if (/[0-9A-Za-z]/.test(e)) throw new AnchorUnsupportedError(`escape \\${e}`);
    this.#i -= 1;
    const cp = src.codePointAt(this.#i)!;
    this.#i += cp > 0xffff ? 2 : 1;
    return this.#literal(cp);
  }

  #skipProperty(): void {
    if (this.#src[this.#i] === '{') {
      const end = this.#src.indexOf('}', this.#i);
      if (end < 0) throw new AnchorUnsupportedError('unterminated property');
      this.#i = end + 1;
    } else this.#i++;
  }

  #hexEscape(): number {
    const src = this.#src;
    let m: RegExpExecArray | null;
    if (src[this.#i] === '{') m = /^\{([0-9A-Fa-f]{1,6})\}/.exec(src.slice(this.#i, this.#i + 9));
    else m = /^([0-9A-Fa-f]{2})/.exec(src.slice(this.#i, this.#i + 2));
    if (!m) throw new AnchorUnsupportedError('hex escape');
    this.#i += m[0].length;
    return Number.parseInt(m[1], 16);
  }

  #foldBytes(bytes: Uint8Array): Uint8Array {
    if (!this.#fold) return bytes;
    const out = union(bytes, HIGH);
    for (let c = 0x41; c <= 0x7a; c++) if (isAsciiLetter(c) && bytes[c]) out[c ^ 0x20] = 1;
    return out;
  }

  #bracket(): Atom {
    const src = this.#src;
    let j = this.#i + 1;
    let negated = false;
    if (src[j] === '^') {
      negated = true;
      j++;
    }
    const bytes = new Uint8Array(256);
    let maxLength = 1;
    let first = true;
    const add = (from: number, to: number) => {
      for (let c = from; c <= Math.min(to, 0x7f); c++) bytes[c] = 1;
      if (to >= 0x80) {
        for (let c = 0x80; c < 256; c++) bytes[c] = 1;
        maxLength = Math.max(maxLength, utf8Length(to));
      }
    };
    /** One class member's code point, or -1 for a set (already added). */
    const member = (): number => {
      const d = src[j];
      if (d === '[' && src[j + 1] === ':') {
        const end = src.indexOf(':]', j + 2);
        if (end < 0) throw new AnchorUnsupportedError('posix class');
        add(0, 0x7f); // a superset of every ASCII posix class
        if (src[j + 2] === '^') add(0x80, 0x10ffff);
        j = end + 2;
        return -1;
      }
      if (d === '\\') {
        const e = src[j + 1];
        if (e === undefined) throw new AnchorUnsupportedError('trailing backslash');
        j += 2;
        if (e === 'd' || e === 'w' || e === 's') {
          const set = e === 'd' ? DIGITS : e === 'w' ? WORD : SPACE;
          for (let c = 0; c < 128; c++) if (set[c]) bytes[c] = 1;
          return -1;
        }
        if (e === 'D' || e === 'W' || e === 'S' || e === 'p' || e === 'P') {
          if (e === 'p' || e === 'P') {
            if (src[j] === '{') {
              const end = src.indexOf('}', j);
              if (end < 0) throw new AnchorUnsupportedError('unterminated property');
              j = end + 1;
            } else j++;
          }
          add(0, 0x10ffff);
          return -1;
        }
        if (e === 'x') {
          const saved = this.#i;
          this.#i = j;
          const cp = this.#hexEscape();
          j = this.#i;
          this.#i = saved;
          return cp;
        }
        if (e in LITERAL_ESCAPES) return LITERAL_ESCAPES[e];
        if (/[0-9A-Za-z]/.test(e)) throw new AnchorUnsupportedError(`escape \\${e} in a class`);
        return e.codePointAt(0)!;
      }
      const cp = src.codePointAt(j)!;
      j += cp > 0xffff ? 2 : 1;
      return cp;
    };
    for (;;) {
      if (j >= src.length) throw new AnchorUnsupportedError('unterminated class');
      if (src[j] === ']' && !first) break;
      first = false;
      const lo = member();
      if (lo < 0) continue;
      if (src[j] === '-' && src[j + 1] !== ']' && j + 1 < src.length) {
        j++;
        const hi = member();
        if (hi < 0) throw new AnchorUnsupportedError('range to a set');
        add(lo, hi);
      } else add(lo, lo);
    }
    this.#i = j + 1;
    const folded = this.#foldBytes(bytes);
    // A negated class keeps the members' own bytes (its complement is then a superset, as it must be).
    if (negated) return this.#class(complement(folded), 4);
    // A non-ASCII member may fold to an ASCII letter (`[ſ]` matches `s`, `[\x{212A}]` matches `k`).
    const reach = this.#fold && hasHigh(bytes) ? union(folded, ASCII_LETTERS) : folded;
    return this.#class(reach, this.#fold && folded[0x80] ? 4 : maxLength);
  }
}

/**
 * How common each byte is in the text agents send (a plan-time guess; only the choice of which byte
 * of a literal Buffer.indexOf looks for depends on it). Lower is rarer.
 */
const COMMONNESS = new Float64Array(256).fill(0.3);
{
  const english = 'etaoinshrdlcumwfgypbvkjxqz';
  for (let k = 0; k < english.length; k++) COMMONNESS[english.charCodeAt(k)] = 12 - k * 0.45;
  for (let c = 0x41; c <= 0x5a; c++) COMMONNESS[c] = 0.6;
  for (let c = 0x30; c <= 0x39; c++) COMMONNESS[c] = 1;
  COMMONNESS[0x20] = 16;
  for (const ch of '.,"\n:-') COMMONNESS[ch.charCodeAt(0)] = 2;
  for (const ch of "()=;/_'") COMMONNESS[ch.charCodeAt(0)] = 1;
}

/**
 * What locating costs, in units of one re2 pass over the view (about 1.5 ns a byte here): the SIMD
 * search (literal-search.ts) about 0.1 ms a MB whatever the bytes (`simd`), and a little more where
 * the rest of a folded literal is read around each run found (`simdConfirmed`, `password` from `word`);
 * without it, a folded literal is a re2 search with its prefix acceleration (about a fifth of a pass),
 * and a case-sensitive one Buffer.indexOf from its rarest byte, which costs with how often that byte
 * occurs.
 */
export const LOCATOR_COST = { fold: 0.2, perCommonness: 0.03, simd: 0.07, simdConfirmed: 0.1 };

/**
 * A folded literal's SIMD search, or null where re2 alone can find it. The run is the literal's
 * longest without `k` or `s` (re2 folds them beyond ASCII), at least two bytes; its two pivots are its
 * rarest bytes, either case counted.
 */
export function foldedPlan(literal: string): FoldedPlan | null {
  if (needleSearch === 'none' || /[^\x00-\x7f]/.test(literal)) return null;
  const lower = literal.toLowerCase();
  let run = { start: 0, end: 0 };
  for (let start = 0; start < lower.length; ) {
    let end = start;
    while (end < lower.length && lower[end] !== 'k' && lower[end] !== 's') end++;
    if (end - start > run.end - run.start) run = { start, end };
    start = end + 1;
  }
  const length = Math.min(run.end - run.start, MAX_NEEDLE);
  if (length < 2) return null;
  const bytes = Buffer.from(lower.slice(run.start, run.start + length), 'latin1');
  if (needleProblem(bytes, true) !== null) return null;
  const weight = (k: number) =>
    COMMONNESS[bytes[k]] + COMMONNESS[bytes[k] >= 0x61 && bytes[k] <= 0x7a ? bytes[k] ^ 0x20 : bytes[k]];
  const order = [...bytes.keys()].sort((a, b) => weight(a) - weight(b) || a - b);
  return {
    needle: { bytes, fold: true, pivots: [order[0], order[1]] },
    exact: length === lower.length,
    head: Buffer.from(lower.slice(0, run.start), 'latin1'),
    tail: Buffer.from(lower.slice(run.start + length), 'latin1'),
  };
}

/** Literals longest first (in UTF-8 bytes), for a leftmost-first alternation. */
function byLengthDown(literals: string[]): string[] {
  return [...literals].sort((a, b) => Buffer.byteLength(b) - Buffer.byteLength(a));
}

function escapeLiteral(s: string): string {
  return s.replace(/[\\^$.|?*+()[\]{}-]/g, '\\$&');
}

/** The leading flag group, if any: its length and whether it folds case. null: flags we do not read. */
function leadingFlags(source: string): { length: number; fold: boolean } | null {
  const m = /^\(\?([imsU]+)\)/.exec(source);
  if (!m) return source.startsWith('(?') && !/^\(\?(:|P?<)/.test(source) ? null : { length: 0, fold: false };
  return { length: m[0].length, fold: m[1].includes('i') };
}

/** The anchor of a pattern compiled with re2 flags `flags` (from `gu`), or null when it has none we can use. */
export function anchorOf(source: string, flags = 'gu'): Anchor | null {
  if (flags.includes('i') || flags.includes('m') || flags.includes('s')) return null;
  const lead = leadingFlags(source);
  if (!lead) return null;
  let atoms: Atom[];
  try {
    const parser = new Parser(source, lead.length, lead.fold);
    const alts = parser.alternation();
    if (!parser.done || alts.length !== 1) return null;
    atoms = alts[0];
  } catch (err) {
    if (err instanceof AnchorUnsupportedError) return null;
    throw err;
  }
  // Candidate anchors: each run of literal characters, and each group of plain literal strings
  // followed by any literal characters.
  let best: { start: number; end: number; literals: string[]; cost: number } | null = null;
  for (let start = 0; start < atoms.length; start++) {
    let literals: string[];
    let end = start;
    if (atoms[start].alts) {
      literals = atoms[start].alts!;
      end = start + 1;
    } else if (atoms[start].char !== null) literals = [''];
    else continue;
    let tail = '';
    while (end < atoms.length && atoms[end].char !== null) tail += String.fromCodePoint(atoms[end++].char!);
    // Only maximal runs: a run that starts mid-run is a worse choice than its whole.
    if (start > 0 && atoms[start].alts === null && atoms[start - 1].char !== null) continue;
    literals = literals.map((l) => l + tail);
    if (literals.some((l) => l.length === 0)) continue;
    const cost = literals.reduce((sum, l) => sum + literalCost(l, lead.fold), 0);
    if (!best || cost < best.cost) best = { start, end, literals, cost };
  }
  if (!best) return null;
  const side = (from: number, to: number) => {
    let max = 0;
    let bytes: Uint8Array = new Uint8Array(256);
    for (let k = from; k < to; k++) {
      max += atoms[k].max;
      bytes = union(bytes, atoms[k].bytes);
    }
    return { max, bytes };
  };
  const prefix = side(0, best.start);
  const suffix = side(best.end, atoms.length);
  const literals = best.literals.map((l) => Buffer.from(l, 'utf8'));
  const fold = lead.fold && best.literals.some((l) => /[A-Za-z]|[^\x00-\x7f]/.test(l));
  const literalSource = `${fold ? '(?i)' : ''}(?:${byLengthDown(best.literals).map(escapeLiteral).join('|')})`;
  return {
    literals,
    fold,
    locators: fold ? best.literals.map((l) => new RE2(`(?i)${escapeLiteral(l)}`, 'gu')) : [],
    folded: fold ? best.literals.map(foldedPlan) : [],
    needles: fold ? [] : literals.map(simdNeedle),
    source: literalSource,
    pivots: literals.map(pivotOf),
    before: prefix.max,
    after: suffix.max,
    prefixBytes: prefix.bytes,
    suffix: {
      bytes: atoms
        .slice(best.end)
        .filter((a) => a.max > 0)
        .map((a) => a.bytes),
      required: atoms
        .slice(best.end)
        .filter((a) => a.max > 0)
        .map((a) => a.min > 0),
    },
    cost: best.cost,
  };
}

function literalCost(literal: string, fold: boolean): number {
  if (fold && /[A-Za-z]|[^\x00-\x7f]/.test(literal)) {
    const plan = foldedPlan(literal);
    if (plan === null) return LOCATOR_COST.fold;
    return plan.exact ? LOCATOR_COST.simd : LOCATOR_COST.simdConfirmed;
  }
  const bytes = Buffer.from(literal, 'utf8');
  if (simdNeedle(bytes) !== null) return LOCATOR_COST.simd;
  // A short literal is found as often as its bytes occur, each occurrence costing a window.
  const lengthFactor = bytes.length === 1 ? 20 : bytes.length === 2 ? 3 : 1;
  return COMMONNESS[bytes[pivotOf(bytes)]] * LOCATOR_COST.perCommonness * lengthFactor;
}

/**
 * Buffer.indexOf runs memchr on its needle's first byte (the pivot): past this weight (pivotOf) it
 * stops often enough in agent JSON to cost more than the SIMD search (`acct_` from its `_`: 0.3 ms a
 * MB on the bench bodies, against 0.1).
 */
const INDEXOF_MAX_WEIGHT = 2;

/**
 * A case-sensitive literal's SIMD search (literal-search.ts) where Buffer.indexOf's pivot is common,
 * its two pivots the literal's rarest bytes; else null (indexOf finds it faster, or no SIMD here).
 */
function simdNeedle(literal: Uint8Array): Needle | null {
  if (needleSearch === 'none' || literal.length > MAX_NEEDLE) return null;
  if (pivotWeight(literal, pivotOf(literal)) < INDEXOF_MAX_WEIGHT) return null;
  const order = [...literal.keys()].sort((a, b) => COMMONNESS[literal[a]] - COMMONNESS[literal[b]] || a - b);
  return { bytes: literal, fold: false, pivots: [order[0], order[order.length > 1 ? 1 : 0]] };
}

/** How often Buffer.indexOf's needle from `k` stops (a final byte weighs thrice: a one-byte needle). */
function pivotWeight(literal: Uint8Array, k: number): number {
  return COMMONNESS[literal[k]] * (k === literal.length - 1 && k > 0 ? 3 : 1);
}

/**
 * Where Buffer.indexOf looks for a literal from: its rarest byte, a final one weighed as thrice as
 * common (a needle of one byte hands every occurrence of that byte back to JavaScript).
 */
function pivotOf(literal: Uint8Array): number {
  let pivot = 0;
  for (let k = 1; k < literal.length; k++) if (pivotWeight(literal, k) < pivotWeight(literal, pivot)) pivot = k;
  return pivot;
}

/** Needle bytes from the pivot: Buffer.indexOf runs memchr on its first byte for short needles only. */
const NEEDLE = 4;

/** Occurrences found before locating gives up (the caller then runs the pattern over the whole view). */
export const MAX_ANCHOR_HITS = 1024;
/** Occurrences of a needle (the literal from its pivot) looked at before locating gives up likewise. */
export const MAX_NEEDLE_PROBES = 16 * MAX_ANCHOR_HITS;

/**
 * Both bounds grow with the view past 8 MB and 4 MB (a window costs about 1.5 µs to run, a probe about
 * 0.1 µs: at most about a set pass's worth each), so that a literal as common as `_` in code does not
 * give up on every large body.
 */
function bounds(view: Uint8Array): { hits: number; probes: number } {
  return {
    hits: Math.max(MAX_ANCHOR_HITS, view.length >>> 13),
    probes: Math.max(MAX_NEEDLE_PROBES, view.length >>> 8),
  };
}

/** Bytes Buffer.indexOf searches at a time between looks at the clock (locate's deadline). */
const CHUNK = 64 * 1024;

/**
 * How long locating one literal may take, per byte of the view, when the caller gives no deadline:
 * about what running the pattern over the whole view costs at worst (re2's DFA, 1.4–1.5 ns a byte).
 */
export const LOCATE_ONE_NS_PER_BYTE = 1.5;

/**
 * Every occurrence of the anchor's literals in `view` as [start, end) pairs in order of start
 * (overlapping ones included), or null past MAX_ANCHOR_HITS (or MAX_NEEDLE_PROBES; more in a large
 * view) or past `deadline` (performance.now()): Buffer.indexOf slows to about 12 ns a byte on a flood
 * of its needle's first byte (`xamp` in a run of `x`), so a case-sensitive literal is searched a chunk at a
 * time, the clock read between chunks. The SIMD search (Anchor.folded, Anchor.needles) reads the clock
 * between its chunks too; its starts checked in full count as probes.
 */
export function locate(
  view: Buffer,
  anchor: Anchor,
  deadline = performance.now() + (view.length * LOCATE_ONE_NS_PER_BYTE) / 1e6,
): number[] | null {
  const hits: number[] = [];
  const bound = bounds(view);
  for (let i = 0; i < anchor.locators.length; i++) {
    // re2 is linear whatever the body (its DFA when the prefix search stalls); only its hits are bounded.
    if (i > 0 && performance.now() > deadline) return null;
    const plan = anchor.folded[i];
    const found =
      plan === null
        ? locatorHits(view, anchor.locators[i], 0, view.length, 2 * bound.hits - hits.length)
        : foldedHits(view, plan, bound, hits.length >> 1, deadline);
    if (found === null) return null;
    for (const h of found) hits.push(h);
  }
  for (let k = 0; k < (anchor.fold ? 0 : anchor.literals.length); k++) {
    const literal = anchor.literals[k];
    const simd = anchor.needles[k];
    if (simd !== null) {
      const starts = findNeedle(view, simd, bound.hits - (hits.length >> 1), bound.probes, deadline);
      if (starts === null) return null;
      for (const s of starts) hits.push(s, s + literal.length);
      continue;
    }
    const pivot = anchor.pivots[k];
    const needle = literal.subarray(pivot, pivot + NEEDLE);
    const whole = needle.length === literal.length;
    let probes = 0;
    // The needle's occurrences starting in [from, from + CHUNK), then the next chunk.
    for (let from = pivot; from < view.length; from += CHUNK) {
      if (from > pivot && performance.now() > deadline) return null;
      const chunk = view.subarray(from, Math.min(view.length, from + CHUNK + needle.length - 1));
      for (let i = chunk.indexOf(needle); i >= 0; i = chunk.indexOf(needle, i + 1)) {
        // A needle that occurs everywhere and is rarely the literal (`_` of `acct_` in a flood of `_`).
        if (++probes > bound.probes) return null;
        const start = from + i - pivot;
        if (start + literal.length > view.length) break;
        if (whole || view.compare(literal, 0, literal.length, start, start + literal.length) === 0) {
          if (hits.length >= 2 * bound.hits) return null;
          hits.push(start, start + literal.length);
        }
      }
    }
  }
  if (anchor.literals.length > 1) {
    const pairs: [number, number][] = [];
    for (let k = 0; k < hits.length; k += 2) pairs.push([hits[k], hits[k + 1]]);
    pairs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    return pairs.flat();
  }
  return hits;
}

/**
 * The occurrences re2 finds from `from` whose start is before `to` ([start, end) pairs, overlapping
 * ones included), or null past `room` numbers.
 */
function locatorHits(view: Buffer, re: RE2, from: number, to: number, room: number): number[] | null {
  const out: number[] = [];
  re.lastIndex = from;
  while (re.lastIndex < to) {
    const m = re.exec(view) as unknown as (Buffer[] & { index: number }) | null;
    if (m === null || m.index >= to) break;
    if (out.length >= room) return null;
    out.push(m.index, m.index + m[0].length);
    // The next occurrence may overlap this one.
    re.lastIndex = m.index + 1;
  }
  return out;
}

/**
 * A folded literal's occurrences by its SIMD search (FoldedPlan), as locatorHits gives them; null past
 * the bounds (`had` occurrences already found) or the deadline. A run that is not the whole literal
 * counts each place found as a probe, and the rest of the literal is read around it (foldedAround).
 */
function foldedHits(
  view: Buffer,
  plan: FoldedPlan,
  bound: { hits: number; probes: number },
  had: number,
  deadline: number,
): number[] | null {
  const length = plan.needle.bytes.length;
  const out: number[] = [];
  if (plan.exact) {
    const starts = findNeedle(view, plan.needle, bound.hits - had, bound.probes, deadline);
    if (starts === null) return null;
    for (const s of starts) out.push(s, s + length);
    return out;
  }
  const runs = findNeedle(view, plan.needle, bound.probes, bound.probes, deadline);
  if (runs === null) return null;
  let sorted = true;
  for (const run of runs) {
    const start = foldedAround(view, plan.head, run - 1, -1);
    if (start < 0) continue;
    const end = foldedAround(view, plan.tail, run + length, 1);
    if (end < 0) continue;
    if (out.length >= 2 * (bound.hits - had)) return null;
    if (out.length > 0 && start < out[out.length - 2]) sorted = false;
    out.push(start, end);
  }
  if (sorted) return out;
  const pairs: [number, number][] = [];
  for (let k = 0; k < out.length; k += 2) pairs.push([out[k], out[k + 1]]);
  return pairs.sort((a, b) => a[0] - b[0]).flat();
}

/** UTF-8 of the characters outside ASCII that re2 folds to an ASCII letter (literal-search.ts). */
const KELVIN_SIGN = Buffer.from('\u212a');
const LONG_S = Buffer.from('\u017f');

/**
 * The literal's characters `chars` (lower case) read under re2's folding backward from `from` (`step`
 * -1: where they start) or forward from it (`step` 1: where they end), or -1 where they are not there.
 * Each character reads one way only: an ASCII byte is never the first or last byte of U+212A or U+017F,
 * so the place found is the one re2's match there has.
 */
function foldedAround(view: Buffer, chars: Uint8Array, from: number, step: 1 | -1): number {
  let i = from;
  for (let c = 0; c < chars.length; c++) {
    const ch = chars[step === -1 ? chars.length - 1 - c : c];
    const b = i >= 0 && i < view.length ? view[i] : -1;
    if (b === ch || (ch >= 0x61 && ch <= 0x7a && b === (ch ^ 0x20))) {
      i += step;
      continue;
    }
    const beyond = ch === 0x6b ? KELVIN_SIGN : ch === 0x73 ? LONG_S : null;
    // The byte at `i` is the character's last byte read backward, its first read forward.
    if (beyond === null || b !== beyond[step === -1 ? beyond.length - 1 : 0]) return -1;
    const first = step === -1 ? i - beyond.length + 1 : i;
    if (first < 0 || first + beyond.length > view.length) return -1;
    for (let k = 0; k < beyond.length; k++) if (view[first + k] !== beyond[k]) return -1;
    i = step === -1 ? first - 1 : first + beyond.length;
  }
  return step === -1 ? i + 1 : i;
}

/**
 * How far past `from` a match's rest can reach: the first byte at which the suffix's relaxed language
 * (Anchor.suffix) has no prefix of the text left, or `cap`. Each element is a state pair, "at its
 * start" and "inside, may move on", stepped over the bytes as a set.
 */
function suffixEnd(view: Buffer, suffix: Anchor['suffix'], from: number, cap: number): number {
  const k = suffix.bytes.length;
  if (k === 0) return from;
  // at[j]: at the start of element j; inside[j]: has read one of its bytes (so may move on).
  const at = new Uint8Array(k + 1);
  const inside = new Uint8Array(k);
  const close = () => {
    for (let j = 0; j < k; j++) if (inside[j] || (at[j] && !suffix.required[j])) at[j + 1] = 1;
  };
  at[0] = 1;
  close();
  const nextInside = new Uint8Array(k);
  for (let i = from; i < cap; i++) {
    const b = view[i];
    let alive = false;
    for (let j = 0; j < k; j++) {
      const step = (at[j] || inside[j]) && suffix.bytes[j][b] === 1 ? 1 : 0;
      nextInside[j] = step;
      if (step) alive = true;
    }
    if (!alive) return i;
    at.fill(0);
    inside.set(nextInside);
    close();
  }
  return cap;
}

/**
 * Bytes the suffix walks may read per byte of the view before windows gives up (then: the whole view).
 * The walk costs about ten times what re2 costs a byte: at 1/32 the worst case stays under a third of
 * one run over the whole view.
 */
const SUFFIX_BUDGET = 1 / 32;

/**
 * The merged windows around the hits, as [start, end) pairs: each side reaches as far as a match can
 * (the bound; before the literal only over bytes a match may hold there, after it only as far as the
 * suffix's language lives), the start moved back to a character's first byte. null when the suffix
 * walks would read more than SUFFIX_BUDGET of the view (long runs the suffix lives through: the whole
 * view costs less).
 */
export function windows(view: Buffer, anchor: Anchor, hits: readonly number[]): number[] | null {
  const out: number[] = [];
  const n = view.length;
  const { before, after, prefixBytes, suffix } = anchor;
  let budget = 4096 + SUFFIX_BUDGET * n;
  for (let k = 0; k < hits.length; k += 2) {
    const hs = hits[k];
    const he = hits[k + 1];
    const floor = out.length > 0 ? out[out.length - 1] : 0;
    // Back over bytes a match may hold before the literal, no further than the previous window.
    let ws = hs;
    const limit = before === Infinity ? floor : Math.max(floor, hs - before);
    while (ws > limit && prefixBytes[view[ws - 1]] === 1) ws--;
    while (ws > 0 && (view[ws] & 0xc0) === 0x80) ws--;
    const cap = after === Infinity ? n : Math.min(n, he + after);
    const walk = Math.min(cap, he + budget);
    const we = suffixEnd(view, suffix, he, walk);
    if (we === walk && walk < cap) return null;
    budget -= we - he;
    if (out.length > 0 && ws <= out[out.length - 1]) out[out.length - 1] = Math.max(out[out.length - 1], we);
    else out.push(ws, we);
  }
  return out;
}

/**
 * The occurrences of the anchor's literals (as locate gives them) whose match may hold, or sit next to,
 * one of `changes` (NormalizedView.changes: a view's start and end at 0 and 1 of each four), looked
 * for only in the spans of `view` where such an occurrence can lie (normalized-windows.ts); null past
 * locate's bounds. A match holds its literal, so a change lies after the literal (the bytes between
 * are a start of the suffix's), before it (the prefix's) or on it:
 *
 * - after: the literal ends at most `after` bytes before the change, or, unbounded, somewhere the
 *   suffix's relaxed language read backward from the change lives (each byte one an element at or
 *   before the previous byte's may hold; every element optional: a superset);
 * - before: it starts at most `before` bytes after the change, or where the prefix's bytes run to;
 * - on it: within a literal's length (four bytes a character when folded) and the two bytes a `\b`
 *   reads either side.
 *
 * Linear: a backward walk stops at the change before (a walk from there, in every state, goes at least
 * as far back), a forward one is not walked again where the last one already went. The bytes walked and
 * searched are taken from `budget`; false once it is spent (the caller then reads the whole view).
 */
export function locateNear(
  view: Buffer,
  anchor: Anchor,
  changes: readonly number[],
  budget: { left: number },
): number[] | null | false {
  const n = view.length;
  const reach = Math.max(...anchor.literals.map((l) => l.length)) * (anchor.fold ? 4 : 1) + 2;
  const { before, after, prefixBytes, suffix } = anchor;
  const spans: number[] = [];
  let lastChange = -1;
  let forward = -1;
  for (let k = 0; k < changes.length; k += 4) {
    const a = changes[k];
    const b = changes[k + 1];
    let start: number;
    if (after === Infinity) {
      const stop = Math.max(0, lastChange);
      const floor = Math.max(stop, a - Math.max(0, Math.floor(budget.left)));
      const end = suffixStart(view, suffix, a, floor);
      budget.left -= a - end;
      if (end === floor && floor > stop) return false;
      // Back to the change before: from there on, that change's walk went as far back as this one can.
      start = lastChange >= 0 && end === stop ? -1 : Math.max(0, end - reach);
    } else start = Math.max(0, a - after - reach);
    lastChange = a;
    let end: number;
    if (before === Infinity) {
      if (forward < b) {
        const limit = Math.min(n, b + Math.max(0, Math.floor(budget.left)));
        forward = b;
        while (forward < limit && prefixBytes[view[forward]] === 1) forward++;
        budget.left -= forward - b;
        if (forward === limit && limit < n) return false;
      }
      end = forward;
    } else end = b + before;
    end = Math.min(n, end + reach);
    const last = spans.length - 1;
    if (last >= 0 && start <= spans[last]) spans[last] = Math.max(spans[last], end);
    else spans.push(start, end);
  }
  for (let k = 0; k < spans.length; k += 2) budget.left -= spans[k + 1] - spans[k];
  if (budget.left < 0) return false;
  const hits: number[] = [];
  for (let k = 0; k < spans.length; k += 2) {
    const found = locate(view.subarray(spans[k], spans[k + 1]), anchor);
    if (found === null) return null;
    for (const h of found) hits.push(h + spans[k]);
  }
  return hits;
}

/**
 * The lowest offset, down to `stop`, at which the literal may end for a match's rest to run on to
 * `from`: the bytes before `from` read backward in the suffix's relaxed language (locateNear).
 */
function suffixStart(view: Buffer, suffix: Anchor['suffix'], from: number, stop: number): number {
  let state = suffix.bytes.length - 1;
  let i = from;
  for (; i > stop; i--) {
    const b = view[i - 1];
    let j = state;
    while (j >= 0 && suffix.bytes[j][b] !== 1) j--;
    if (j < 0) break;
    state = j;
  }
  return i;
}

/** How far before a view's end runsIntoEnds steps the suffix's language from every state at once. */
export const TAIL_BYTES = 64 * 1024;

/**
 * Where windows() gave up on a view (a flood of the literal, or suffix walks past their budget):
 * whether a match around some occurrence of the literal may still run into the view's first byte
 * (`start`) or its last (`end`), so that the view cannot hold it. Conservative: true when unsure.
 *
 * - The first byte: an occurrence's window reaches back to it when every byte before the occurrence is
 *   one the prefix may hold, and there are no more than `before` of them: only an occurrence starting
 *   in that head of the view (found by locate over the head alone, or unsure).
 * - The last byte: the suffix's language (Anchor.suffix) stepped over the last TAIL_BYTES from every
 *   state at once (a superset of each walk alive there), restarted at every occurrence's end after it;
 *   if no state lives through the last byte, no window reaches it.
 */
export function runsIntoEnds(
  view: Buffer,
  anchor: Anchor,
  hits: readonly number[] | null,
  start: boolean,
  end: boolean,
): boolean {
  const n = view.length;
  const longest = Math.max(...anchor.literals.map((l) => l.length)) * 4;
  if (start) {
    // The head: the bytes from 0 the prefix may hold (at most `before`); 3 more for a character's
    // continuation bytes a window's start backs over.
    const cap = anchor.before === Infinity ? n : Math.min(n, anchor.before);
    let q = 0;
    while (q < cap && anchor.prefixBytes[view[q]] === 1) q++;
    q += 3;
    let found = hits;
    if (found === null) {
      found = locate(view.subarray(0, Math.min(n, q + longest)), anchor);
      if (found === null) return true; // a flood in the head itself
    }
    if (found.length > 0 && found[0] <= q) return true; // in order of start
  }
  if (!end) return false;
  const from = Math.max(0, n - TAIL_BYTES);
  // The occurrences ending after `from` (one may start before it).
  let ends: number[];
  if (hits) {
    ends = [];
    for (let k = 0; k < hits.length; k += 2) if (hits[k + 1] > from) ends.push(hits[k + 1]);
    // In order of start; overlapping alternatives end out of order (`abcde` at 0, `bc` at 1).
    ends.sort((a, b) => a - b);
  } else {
    const base = Math.max(0, from - longest);
    const tail = locate(view.subarray(base), anchor);
    if (tail === null) return true; // a flood in the tail itself
    ends = [];
    for (let k = 0; k < tail.length; k += 2) if (base + tail[k + 1] > from) ends.push(base + tail[k + 1]);
    ends.sort((a, b) => a - b);
  }
  return suffixLivesToEnd(view, anchor.suffix, from, ends);
}

/**
 * Whether the suffix's language, every state live at `from` (none when `from` is 0) and its start
 * state entered again at each of `ends` (ascending), still reads the view's last byte.
 */
function suffixLivesToEnd(view: Buffer, suffix: Anchor['suffix'], from: number, ends: readonly number[]): boolean {
  const n = view.length;
  const k = suffix.bytes.length;
  if (ends.length > 0 && ends[ends.length - 1] >= n) return true; // an occurrence ends the view
  if (k === 0) return false; // a window ends with its literal
  const at = new Uint8Array(k + 1);
  const inside = new Uint8Array(k);
  const nextInside = new Uint8Array(k);
  const close = () => {
    for (let j = 0; j < k; j++) if (inside[j] || (at[j] && !suffix.required[j])) at[j + 1] = 1;
  };
  if (from > 0) {
    at.fill(1);
    inside.fill(1);
  }
  let live = from > 0;
  let e = 0;
  for (let i = from; i < n; i++) {
    while (e < ends.length && ends[e] <= i) {
      if (ends[e] === i) {
        at[0] = 1;
        close();
        live = true;
      }
      e++;
    }
    if (!live) {
      // Nothing alive until the next occurrence's end.
      if (e >= ends.length) return false;
      i = ends[e] - 1;
      continue;
    }
    const b = view[i];
    live = false;
    for (let j = 0; j < k; j++) {
      const step = (at[j] || inside[j]) && suffix.bytes[j][b] === 1 ? 1 : 0;
      nextInside[j] = step;
      if (step) live = true;
    }
    at.fill(0);
    inside.set(nextInside);
    if (live) close();
    else inside.fill(0);
  }
  return live;
}
