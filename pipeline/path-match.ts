import { BadGlobError } from './errors.ts';

// Go's path.Match, ported rule for rule (go/src/path/match.go), because model policies are authored in
// its syntax (spec: model_policy "Glob patterns in path.Match syntax"):
//   *      any sequence of characters except '/'
//   ?      any single character except '/'
//   [...]  a class: ranges `a-z`, negation `[^...]`, `\` escapes inside; `]` first is malformed
//   \c     the character c
// Code points stand in for Go's runes. A malformed pattern matches nothing (callers check validity once).

type Runes = readonly string[];

function scanChunk(pattern: Runes): { star: boolean; chunk: Runes; rest: Runes } {
  let p = 0;
  let star = false;
  while (p < pattern.length && pattern[p] === '*') {
    p++;
    star = true;
  }
  let inRange = false;
  let i = p;
  scan: for (; i < pattern.length; i++) {
    switch (pattern[i]) {
      case '\\':
        if (i + 1 < pattern.length) i++;
        break;
      case '[':
        inRange = true;
        break;
      case ']':
        inRange = false;
        break;
      case '*':
        if (!inRange) break scan;
        break;
    }
  }
  return { star, chunk: pattern.slice(p, i), rest: pattern.slice(i) };
}

function getEsc(chunk: Runes, at: number): { r: string; next: number } {
  if (at >= chunk.length || chunk[at] === '-' || chunk[at] === ']') throw new BadGlobError('malformed glob');
  if (chunk[at] === '\\') {
    at++;
    if (at >= chunk.length) throw new BadGlobError('malformed glob');
  }
  const r = chunk[at];
  if (at + 1 >= chunk.length) throw new BadGlobError('malformed glob');
  return { r, next: at + 1 };
}

/** Matches `chunk` against the start of `s`; returns the rest of `s`, or null. Throws on a malformed chunk. */
function matchChunk(chunk: Runes, s: Runes): Runes | null {
  let failed = false;
  let c = 0;
  let si = 0;
  while (c < chunk.length) {
    if (!failed && si >= s.length) failed = true;
    const ch = chunk[c];
    if (ch === '[') {
      let r = '';
      if (!failed) r = s[si++];
      c++;
      let negated = false;
      if (c < chunk.length && chunk[c] === '^') {
        negated = true;
        c++;
      }
      let match = false;
      let nrange = 0;
      for (;;) {
        if (c < chunk.length && chunk[c] === ']' && nrange > 0) {
          c++;
          break;
        }
        const lo = getEsc(chunk, c);
        c = lo.next;
        let hi = lo.r;
        if (chunk[c] === '-') {
          const h = getEsc(chunk, c + 1);
          hi = h.r;
          c = h.next;
        }
        const rc = r.codePointAt(0) ?? 0;
        if ((lo.r.codePointAt(0) ?? 0) <= rc && rc <= (hi.codePointAt(0) ?? 0)) match = true;
        nrange++;
      }
      if (match === negated) failed = true;
    } else if (ch === '?') {
      if (!failed) {
        if (s[si] === '/') failed = true;
        si++;
      }
      c++;
    } else {
      let lit = ch;
      if (ch === '\\') {
        c++;
        if (c >= chunk.length) throw new BadGlobError('malformed glob');
        lit = chunk[c];
      }
      if (!failed) {
        if (lit !== s[si]) failed = true;
        si++;
      }
      c++;
    }
  }
  return failed ? null : s.slice(si);
}

function match(pattern: Runes, name: Runes): boolean {
  let p = pattern;
  let n = name;
  outer: while (p.length > 0) {
    const { star, chunk, rest } = scanChunk(p);
    p = rest;
    if (star && chunk.length === 0) return !n.includes('/');
    const t = matchChunk(chunk, n);
    if (t !== null && (t.length === 0 || p.length > 0)) {
      n = t;
      continue;
    }
    if (star) {
      for (let i = 0; i < n.length && n[i] !== '/'; i++) {
        const t2 = matchChunk(chunk, n.slice(i + 1));
        if (t2 !== null) {
          if (p.length === 0 && t2.length > 0) continue;
          n = t2;
          continue outer;
        }
      }
    }
    return false;
  }
  return n.length === 0;
}

/** True when Go's path.Match would report ErrBadPattern for this pattern against some name. */
export function isValidPattern(pattern: string): boolean {
  let p: Runes = Array.from(pattern);
  try {
    while (p.length > 0) {
      const { chunk, rest } = scanChunk(p);
      matchChunk(chunk, []);
      p = rest;
    }
    return true;
  } catch (err) {
    if (err instanceof BadGlobError) return false;
    throw err;
  }
}

/** Go's path.Match for a valid pattern; a malformed pattern matches nothing. */
export function pathMatch(pattern: string, name: string): boolean {
  if (!isValidPattern(pattern)) return false;
  try {
    return match(Array.from(pattern), Array.from(name));
  } catch (err) {
    if (err instanceof BadGlobError) return false;
    throw err;
  }
}
