// How far a custom pattern's matches reach across a byte range's edge (byte-ranges.ts) or around what
// normalization changed (normalized-windows.ts): read from the RE2 source alone, so that the range
// planner, the windows and the patterns inspector can all ask it; and how far a secret's do.

/** A secret or pattern longer than this is not split for: it scans whole (the overlap would be huge). */
export const MAX_REACH = 64 * 1024;

// The separators as UTF-16 code units, for reading a pattern's character classes.
const SEPARATOR_CODES = [0x0a, 0x2c, 0x3a, 0x5b, 0x5d, 0x7b, 0x7d];
const SAFE_POSIX = new Set(['alpha', 'digit', 'alnum', 'upper', 'lower', 'xdigit']);

/** The index of the last character of the escape whose backslash is at `k` (`\x{…}`, `\x7e`, `\p{…}`, `\123`). */
function escapeEnd(source: string, k: number): number {
  const e = source[k + 1];
  if ((e === 'x' || e === 'p' || e === 'P') && source[k + 2] === '{') {
    const end = source.indexOf('}', k + 3);
    return end < 0 ? source.length - 1 : end;
  }
  if (e === 'x') return Math.min(source.length - 1, k + 3);
  if (e >= '0' && e <= '7') {
    let m = k + 1;
    while (m < k + 3 && source[m + 1] >= '0' && source[m + 1] <= '7') m++;
    return m;
  }
  return k + 1;
}

/**
 * How far a custom pattern's matches reach across an edge, in view bytes: 0 when no match can hold a
 * separator (then none crosses an edge, however long: `[a-z0-9-]+\.corp\.example\.com`), else the
 * longest match (4 bytes a character) when that is bounded. null when no overlap holds it: unbounded and
 * able to match a separator (`\S{6,}`, `.*`), or reading what surrounds a match where a range ends
 * (`^`, `$`, `\A`, `\z`, `\B`; `\b` is kept: every edge follows a non-word byte, as a range's start
 * does, and at a range's end it can only miss a match that the next range, reading on, makes).
 * Conservative: each character of the source yields at most one character of a match, and each
 * repetition multiplies by its maximum whatever it repeats.
 */
export function patternReach(source: string): number | null {
  let product = 1;
  let bounded = true;
  let separatorFree = true;
  const literal = (code: number) => {
    if (SEPARATOR_CODES.includes(code)) separatorFree = false;
  };
  for (let i = 0; i < source.length; i++) {
    const c = source[i];
    if (c === '\\') {
      const next = source[++i] ?? '';
      if (next === '' || next === 'B' || next === 'A' || next === 'z') return null;
      if (next === 'Q') {
        const end = source.indexOf('\\E', i + 1);
        const text = source.slice(i + 1, end < 0 ? source.length : end);
        for (let k = 0; k < text.length; k++) literal(text.charCodeAt(k));
        i = end < 0 ? source.length : end + 1;
      } else if (next === 'p' || next === 'P' || next === 'x') {
        separatorFree = false; // not read further: it may name a separator
        if (source[i + 1] === '{') {
          const end = source.indexOf('}', i + 2);
          if (end < 0) return null;
          i = end;
        } else i += next === 'x' ? 2 : 1;
      } else if (next === 'b' || next === 'd' || next === 'w' || 'trfv'.includes(next)) {
        // a word boundary, digits, word characters, control characters other than the newline
      } else if (/[0-9A-Za-z]/.test(next)) {
        separatorFree = false; // \n, \s, \S, \D, \W, \C and the like
      } else literal(next.charCodeAt(0));
      continue;
    }
    if (c === '[') {
      let j = i + 1;
      if (source[j] === '^') {
        separatorFree = false;
        j++;
      }
      let first = true;
      for (; j < source.length && (source[j] !== ']' || first); j++) {
        first = false;
        const d = source[j];
        if (d === '[' && source[j + 1] === ':') {
          const end = source.indexOf(':]', j + 2);
          if (end < 0) return null;
          if (!SAFE_POSIX.has(source.slice(j + 2, end))) separatorFree = false;
          j = end + 1;
          continue;
        }
        // One item: a character, or an escape (its last character at `last`); its code when it is one
        // read here (a letter or digit escape names a class or a character not read: null).
        let last = j;
        let code: number | null = d.charCodeAt(0);
        if (d === '\\') {
          if (j + 1 >= source.length) return null;
          last = escapeEnd(source, j);
          code = /[0-9A-Za-z]/.test(source[j + 1]) ? null : source.charCodeAt(j + 1);
        }
        if (source[last + 1] === '-' && last + 2 < source.length && source[last + 2] !== ']') {
          // A range: its ends may be escapes too (`[\t-\r]`, `[a-\x7e]`); one not read is taken to
          // reach a separator.
          const from = last + 2;
          const to =
            source[from] === '\\'
              ? /[0-9A-Za-z]/.test(source[from + 1] ?? '')
                ? null
                : source.charCodeAt(from + 1)
              : source.charCodeAt(from);
          if (code === null || to === null || SEPARATOR_CODES.some((s) => s >= code && s <= to)) separatorFree = false;
          j = source[from] === '\\' ? escapeEnd(source, from) : from;
          continue;
        }
        if (code !== null) literal(code);
        else {
          const e = source[j + 1];
          // digits, word characters and the control characters other than the newline hold none
          if (!(e === 'd' || e === 'w' || 'trfv'.includes(e))) separatorFree = false;
        }
        j = last;
      }
      i = j;
      continue;
    }
    if (c === '^' || c === '$') return null;
    if (c === '.') separatorFree = false;
    else if (c === '*' || c === '+') bounded = false;
    else if (c === '?' || c === '|' || c === ')') continue;
    else if (c === '(') {
      // A group's flags or its name are no characters of a match.
      if (source[i + 1] === '?') {
        const close = source.slice(i).search(/[:)>]/);
        if (close > 0) i += close;
      }
    } else if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(source.slice(i, i + 24));
      if (m) {
        if (m[2] !== undefined && m[3] === '') bounded = false;
        else product *= Math.max(1, Number(m[3] ?? m[1]));
        i += m[0].length - 1;
      } else literal(0x7b);
    } else literal(c.charCodeAt(0));
  }
  if (separatorFree) return 0;
  const chars = source.length * product;
  return bounded && chars * 4 <= MAX_REACH ? chars * 4 : null;
}

/**
 * The reach the secrets need: the longest form of a value the scan looks for, its JSON-escaped one
 * (six bytes, as `\u00e9`, per UTF-16 unit): at most 6 bytes per byte. null when too long to split for.
 */
export function secretsReach(secrets: readonly string[]): number | null {
  let reach = 0;
  for (const s of secrets) reach = Math.max(reach, 6 * Buffer.byteLength(s));
  return reach > MAX_REACH ? null : reach;
}
