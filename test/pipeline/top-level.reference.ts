// topLevelOf as it was before the small-scan work (docs/decisions.md, "A small scan's fixed cost"):
// closures over the walk's position, indexOf per string, Buffer.compare per key. The oracle the
// property test holds the faster walk to (small-scan.test.ts). Kept verbatim but for the names.

const BACKSLASH = 0x5c;

export interface Span {
  start: number;
  end: number;
}

/** Leading whitespace is valid JSON and the sender's to choose: all of it is skipped, however long. */
function firstNonSpace(body: Uint8Array): number {
  for (let i = 0; i < body.length; i++) {
    const b = body[i];
    if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) return i;
  }
  return -1;
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

/** The top level of a JSON object body and the value of each of `keys` (as topLevel reads one), in one walk. */
interface TopLevelValues {
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
export function topLevelOfBefore(body: Buffer, keys: readonly string[], anyCase?: Span[]): TopLevelValues | null {
  const n = body.length;
  const quotedKeys = keys.map(quotedKey);
  const quoted = quotedKeys[0];
  const lower = anyCase ? keys[0].toLowerCase() : '';
  let i = firstNonSpace(body);
  if (i < 0 || body[i] !== 0x7b) return null;
  const open = i;
  i++;
  const skipWs = () => {
    while (i < n) {
      const b = body[i];
      if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) break;
      i++;
    }
  };
  // Returns the index just past the closing quote of the string starting at `start` (a quote), or -1.
  const stringEnd = (start: number): number => {
    let j = start + 1;
    for (;;) {
      const q = body.indexOf(0x22, j);
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
  };
  const skipValue = (): boolean => {
    if (i >= n) return false;
    const b = body[i];
    if (b === 0x22) {
      const e = stringEnd(i);
      if (e < 0) return false;
      i = e;
      return true;
    }
    if (b === 0x7b || b === 0x5b) {
      let depth = 0;
      while (i < n) {
        const c = body[i];
        if (c === 0x22) {
          const e = stringEnd(i);
          if (e < 0) return false;
          i = e;
          continue;
        }
        if (c === 0x7b || c === 0x5b) depth++;
        else if (c === 0x7d || c === 0x5d) {
          depth--;
          if (depth === 0) {
            i++;
            return true;
          }
        }
        i++;
      }
      return false;
    }
    const from = i;
    while (i < n) {
      const c = body[i];
      if (c === 0x2c || c === 0x7d || c === 0x5d || c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) break;
      i++;
    }
    return i > from;
  };
  const values: (Span | null)[] = keys.map(() => null);
  let members = 0;
  for (;;) {
    skipWs();
    if (i < n && body[i] === 0x7d && members === 0) return { open, close: i, empty: true, values };
    if (i >= n || body[i] !== 0x22) return null;
    const keyEnd = stringEnd(i);
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
        if (keyEnd - i === key.length && body.compare(key, 0, key.length, i, keyEnd) === 0) matches = q;
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
    i = keyEnd;
    skipWs();
    if (body[i] !== 0x3a) return null;
    i++;
    skipWs();
    const valueStart = i;
    if (!skipValue()) return null;
    members++;
    if (matches >= 0) values[matches] = { start: valueStart, end: i };
    if (anyCase && (matches === 0 || matchesAnyCase)) anyCase.push({ start: valueStart, end: i });
    skipWs();
    if (body[i] === 0x2c) {
      i++;
      continue;
    }
    if (body[i] === 0x7d) return { open, close: i, empty: false, values };
    return null;
  }
}
