// The models a pass-through call names, for model restriction. An inference call names one, its
// top-level `model`. The providers' other routes can name a model anywhere:
//   - embeddings and legacy completions: at the top level;
//   - Anthropic message batches: `requests[].params.model`;
//   - an OpenAI batch input file (JSONL, in a multipart upload): `body.model` on every line.
// A call must not reach a model through one of these that policy keeps it from through /v1/messages.
//
// A JSON body is parsed, and every value of a `model` key at any depth is collected. A key spelt
// with escapes (`"mod\u0065l"`) is found, because the parser decodes it. Text inside string values
// is never mistaken for a key. Anything else (multipart, JSONL) is searched line by line: each line
// that parses as JSON is walked the same way. A `model` that is not a string is named as null, which
// an allowlist refuses.

const MAX_DEPTH = 64;

export function namedModels(body: Buffer): (string | null)[] {
  const out: (string | null)[] = [];
  if (body.length === 0) return out;
  const text = body.toString('utf8');
  const whole = parse(text);
  if (whole !== undefined) {
    collect(whole, out);
    return out;
  }
  for (const line of text.split(/\r?\n/)) {
    const trimmed = line.trim();
    if (!trimmed.startsWith('{')) continue;
    const value = parse(trimmed);
    if (value !== undefined) collect(value, out);
  }
  return out;
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** Walks the value without recursion; past MAX_DEPTH nothing further down is read. */
function collect(root: unknown, out: (string | null)[]): void {
  const stack: [unknown, number][] = [[root, 0]];
  while (stack.length > 0) {
    const [value, depth] = stack.pop()!;
    if (value === null || typeof value !== 'object' || depth > MAX_DEPTH) continue;
    if (Array.isArray(value)) {
      for (const item of value) stack.push([item, depth + 1]);
      continue;
    }
    for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
      if (key === 'model') out.push(typeof item === 'string' ? item : null);
      stack.push([item, depth + 1]);
    }
  }
}
