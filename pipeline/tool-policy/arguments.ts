import { createHash } from 'node:crypto';

// A tool call's arguments as the evaluator reads them: parsed once, checked for depth, and digested.
//
//   text ──depth ≤ 64?──▶ JSON.parse ──▶ an object: its values are what `arg_gt` reads
//          │                 │            anything else (array, string, …): "not an object"
//          └▶ too deep       └▶ throws: "does not parse"
//
// The digest binds an approval to the exact arguments (docs/tool-policy.md, "Arguments digest"):
// SHA-256 (hex) of the canonical JSON of the parsed value (keys sorted by UTF-16 code units, no
// whitespace, strings re-escaped by JSON.stringify, numbers as written), or of the raw text when it
// does not parse. Numbers are kept as written because two texts that parse to one double are not one
// call to every tool: `1e400` (Infinity here, which JSON.stringify would write as `null`), `1.0` and
// `1`, or integers past 2^53 that a Python tool reads exactly.

/** Arguments nested deeper than this are not evaluated (fail closed) and digested as text. */
export const MAX_ARGUMENT_DEPTH = 64;

export interface ParsedArguments {
  /** The parsed arguments when they are a JSON object; null otherwise. */
  object: Record<string, unknown> | null;
  /** Why `object` is null, as a phrase ("do not parse as JSON"); null when it is set. */
  problem: string | null;
  /** SHA-256 hex of the canonical JSON (parsed) or of the raw text (not parsed). */
  digest: string;
}

/** Numbers whose text is not what JSON.stringify would write, by holder and key. */
type NumberTexts = WeakMap<object, Map<string, string>>;

export function parseArguments(text: string): ParsedArguments {
  if (nestingDepth(text) > MAX_ARGUMENT_DEPTH) {
    return { object: null, problem: `nest deeper than ${MAX_ARGUMENT_DEPTH} levels`, digest: sha256(text) };
  }
  const numbers: NumberTexts = new WeakMap();
  let value: unknown;
  try {
    value = JSON.parse(
      text,
      function keepNumberText(this: object, key: string, v: unknown, context?: { source?: string }) {
        if (typeof v === 'number' && context?.source !== undefined && context.source !== JSON.stringify(v)) {
          let texts = numbers.get(this);
          if (texts === undefined) numbers.set(this, (texts = new Map()));
          texts.set(key, context.source);
        }
        return v;
      },
    );
  } catch {
    return { object: null, problem: 'do not parse as JSON', digest: sha256(text) };
  }
  const digest = sha256(canonicalJson(value, numbers));
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { object: null, problem: 'are not a JSON object', digest };
  }
  return { object: value as Record<string, unknown>, problem: null, digest };
}

/** SHA-256, hex. */
export function sha256(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/**
 * Canonical JSON of a parsed value (depth already bounded): object keys sorted, no whitespace. A number
 * is written as its source text when `numbers` has it (see the header), else as JSON.stringify does.
 */
export function canonicalJson(value: unknown, numbers?: NumberTexts): string {
  const out: string[] = [];
  write(value, null, '', numbers, out);
  return out.join('');
}

function write(value: unknown, holder: object | null, key: string, numbers: NumberTexts | undefined, out: string[]) {
  if (value === null || typeof value !== 'object') {
    const source = typeof value === 'number' && holder !== null ? numbers?.get(holder)?.get(key) : undefined;
    // undefined never comes out of JSON.parse; a caller's value with one is written as null, like an array's hole.
    out.push(source ?? JSON.stringify(value) ?? 'null');
    return;
  }
  if (Array.isArray(value)) {
    out.push('[');
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out.push(',');
      write(value[i], value, String(i), numbers, out);
    }
    out.push(']');
    return;
  }
  out.push('{');
  const keys = Object.keys(value).sort();
  for (let i = 0; i < keys.length; i++) {
    if (i > 0) out.push(',');
    out.push(JSON.stringify(keys[i]), ':');
    write((value as Record<string, unknown>)[keys[i]], value, keys[i], numbers, out);
  }
  out.push('}');
}

/**
 * The deepest nesting of `[`/`{` outside strings, stopping once past the bound: a cheap walk, so a
 * hostile `[[[[…` never reaches the recursive parts (the reviver, the canonical writer).
 */
export function nestingDepth(text: string): number {
  let depth = 0;
  let deepest = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // Skip the string: up to the next quote that is not escaped.
      for (i++; i < text.length; i++) {
        const s = text.charCodeAt(i);
        if (s === 0x5c) i++;
        else if (s === 0x22) break;
      }
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > deepest && (deepest = depth) > MAX_ARGUMENT_DEPTH) return deepest;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return deepest;
}
