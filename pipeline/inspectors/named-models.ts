import { isUtf8 } from 'node:buffer';

// The models a pass-through call names, for model restriction. An inference call names one: its
// top-level `model`. The providers' other routes can name a model anywhere:
//   - embeddings and legacy completions name it at the top level;
//   - Anthropic message batches name it at `requests[].params.model`;
//   - an OpenAI batch input file names it at `body.model` on every JSONL line;
//   - audio and image uploads name it in a multipart form field called `model`.
// A call must not reach a model through one of these routes when policy keeps it from that model
// through /v1/messages.
//
// How each kind of body is read:
//   - JSON: parsed, and every value of a `model` key at any depth is collected. A key spelt with
//     escapes (`"mod\u0065l"`) is decoded by the parser, so it is found. Text inside a string value is
//     never mistaken for a key.
//   - multipart/form-data: split into parts. A field called `model` names its value. Every other
//     part is read as a body of its own.
//   - Other text (JSONL, plain files): read line by line. Each line that parses as JSON is walked.
//   - Binary content: names nothing.
//
// A `model` value that is not a string is named as null, which an allowlist refuses. The answer is
// null when the body may name a model in a way this cannot read:
//   - it looks like JSON but does not parse (`NaN` is valid JSON to Python);
//   - a text line mentions a `"model":` key but does not parse (a JSONL line cut in two);
//   - it nests or branches past the budget.
// Under a model policy, the caller refuses such a body.

const MAX_DEPTH = 64;
const MAX_NODES = 5_000_000;
const MODEL_KEY_TEXT = /"model"\s*:/i;

export type NamedModels = (string | null)[] | null;

export function namedModels(body: Buffer, contentType?: string | null): NamedModels {
  const out: (string | null)[] = [];
  const budget = { nodes: MAX_NODES };
  const boundary = multipartBoundary(contentType);
  const ok = boundary ? readMultipart(body, boundary, out, budget) : readBody(body, out, budget);
  return ok ? out : null;
}

function readBody(body: Buffer, out: (string | null)[], budget: { nodes: number }): boolean {
  if (body.length === 0 || !isUtf8(body)) return true; // binary content names no model
  let text = body.toString('utf8');
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const first = text.trimStart()[0];
  if (first === '{' || first === '[') {
    const whole = parse(text);
    if (whole !== undefined) return collect(whole, out, budget);
    if (!/[\r\n]/.test(text.trim())) return false; // one document that does not parse
  }
  for (const line of text.split(/\r\n|\r|\n/)) {
    const trimmed = line.trim();
    if (trimmed === '') continue;
    const value = trimmed[0] === '{' || trimmed[0] === '[' ? parse(trimmed) : undefined;
    if (value !== undefined) {
      if (!collect(value, out, budget)) return false;
    } else if (MODEL_KEY_TEXT.test(trimmed)) {
      return false;
    }
  }
  return true;
}

function multipartBoundary(contentType: string | null | undefined): string | null {
  if (!contentType || !/^multipart\/form-data\b/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]+)"|([^\s;]+))/i.exec(contentType);
  return m ? (m[1] ?? m[2]) : null;
}

/** Parts of a multipart/form-data body (RFC 7578): a `model` field names its value; others are bodies. */
function readMultipart(body: Buffer, boundary: string, out: (string | null)[], budget: { nodes: number }): boolean {
  const delimiter = Buffer.from(`--${boundary}`);
  let at = body.indexOf(delimiter);
  if (at < 0) return readBody(body, out, budget);
  for (;;) {
    const partStart = at + delimiter.length;
    if (body[partStart] === 0x2d && body[partStart + 1] === 0x2d) return true; // closing delimiter
    const next = body.indexOf(delimiter, partStart);
    if (next < 0) return false; // a part without its closing delimiter: cannot tell where it ends
    const part = body.subarray(partStart, next);
    const headersEnd = part.indexOf('\r\n\r\n');
    if (headersEnd >= 0) {
      const headers = part.toString('latin1', 0, headersEnd);
      // The content runs to the CRLF that precedes the next delimiter.
      let content = part.subarray(headersEnd + 4);
      if (content.length >= 2 && content[content.length - 2] === 0x0d && content[content.length - 1] === 0x0a) content = content.subarray(0, content.length - 2);
      const name = /content-disposition:[^\r\n]*;\s*name="([^"]*)"/i.exec(headers)?.[1];
      if (name === 'model') out.push(content.toString('utf8').trim());
      else if (!readBody(content, out, budget)) return false;
    }
    at = next;
  }
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** Walks the value without recursion; false when it branches past the budget. */
function collect(root: unknown, out: (string | null)[], budget: { nodes: number }): boolean {
  const stack: [unknown, number][] = [[root, 0]];
  while (stack.length > 0) {
    if (--budget.nodes < 0) return false;
    const [value, depth] = stack.pop()!;
    if (value === null || typeof value !== 'object' || depth > MAX_DEPTH) continue;
    if (Array.isArray(value)) {
      for (const item of value) if (item !== null && typeof item === 'object') stack.push([item, depth + 1]);
      continue;
    }
    for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
      if (key.toLowerCase() === 'model') out.push(typeof item === 'string' ? item : null);
      if (item !== null && typeof item === 'object') stack.push([item, depth + 1]);
    }
  }
  return true;
}
