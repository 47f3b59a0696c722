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
//   - A JSON body (its first non-space character is `{` or `[`) is parsed. Every string value of a
//     `model` key, in any letter case and at any depth, is collected. Objects and arrays under that
//     key (a tool's `input_schema.properties.model`) name nothing.
//   - multipart/form-data is split into parts. A field called `model` names its value, and a file
//     part is read as a batch input file (below).
//   - A batch input file is read line by line. A line that parses names its `body.model`, its
//     `params.model` and its top-level `model`. A data file that merely has a `model` key elsewhere
//     names nothing.
//   - Other text and binary content name nothing.
//
// The answer is null when a body may name a model in a form this cannot read, and an upstream
// might still read it:
//   - JSON that does not parse, when it mentions `model` or holds a `\u` escape (`NaN` is valid to
//     Python);
//   - a batch-file line that does not parse but mentions `custom_id` or `model` (a line cut in two);
//   - a multipart body whose boundary or part headers are ambiguous or oversized;
//   - more nodes than the budget.
// Under a model policy, the caller refuses such a body.

const MAX_DEPTH = 64;
const MAX_NODES = 5_000_000;
const MAX_PART_HEADERS = 16 * 1024;
/** Text that can name a model: the key itself, or an escape that could spell it. */
const MAY_NAME_MODEL = /model|\\u/i;
/** A batch-file line that can name a model: as above, or a request line's `custom_id`. */
const MAY_BE_REQUEST = /model|custom_id|\\u/i;

export type NamedModels = string[] | null;

interface State {
  out: string[];
  nodes: number;
}

export function namedModels(body: Buffer, contentType?: string | null): NamedModels {
  const state: State = { out: [], nodes: MAX_NODES };
  const multipart = contentType && /^\s*multipart\/form-data\b/i.test(contentType);
  if (multipart) {
    const boundary = multipartBoundary(contentType);
    return boundary !== null && readMultipart(body, boundary, state) ? state.out : null;
  }
  return readJson(body, state) ? state.out : null;
}

/** A JSON body; anything else names nothing. */
function readJson(body: Buffer, state: State): boolean {
  let text = body.toString('utf8');
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const first = text.trimStart()[0];
  if (first !== '{' && first !== '[') return true;
  if (!MAY_NAME_MODEL.test(text)) return true; // nothing in it can spell a model key
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return false; // a parser that accepts it may read a model we cannot see
  }
  return collect(value, state, (key) => key.toLowerCase() === 'model');
}

/**
 * A batch input file: JSONL of requests, each naming its model at `body.model` (OpenAI) or
 * `params.model`. `strict` (a `.jsonl` file, or a chunk of an upload with no file name): a line that
 * looks like a request but does not parse is a line cut in two, and makes the body unreadable.
 */
function readBatchFile(content: Buffer, state: State, strict: boolean): boolean {
  const text = content.toString('utf8');
  if (!MAY_BE_REQUEST.test(text)) return true;
  for (const line of text.split(/\r\n|\r|\n/)) {
    const trimmed = line.trim();
    if (trimmed === '' || !MAY_BE_REQUEST.test(trimmed)) continue;
    let value: unknown;
    try {
      value = JSON.parse(trimmed);
    } catch {
      // A request line we cannot read.
      if (strict && (/^[{[]|custom_id/i.test(trimmed) || /"model"\s*:/i.test(trimmed))) return false;
      continue;
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) continue;
    const request = value as Record<string, unknown>;
    for (const holder of [request, request.body, request.params]) {
      if (holder === null || typeof holder !== 'object' || Array.isArray(holder)) continue;
      for (const [key, item] of Object.entries(holder as Record<string, unknown>)) {
        if (key.toLowerCase() === 'model' && typeof item === 'string') state.out.push(item);
      }
    }
  }
  return true;
}

/**
 * The boundary parameter, or null when it is missing or ambiguous: more than one, or a quote earlier
 * in the parameters, so that parsers may not agree on which is the boundary.
 */
function multipartBoundary(contentType: string): string | null {
  const params = contentType.slice(contentType.indexOf(';') + 1);
  const all = [...params.matchAll(/boundary\s*=/gi)];
  if (all.length !== 1) return null;
  if (params.slice(0, all[0].index).includes('"')) return null;
  const m = /boundary\s*=\s*(?:"([^"]{1,200})"|([^\s;"]{1,200}))/i.exec(params);
  return m ? (m[1] ?? m[2]) : null;
}

/**
 * Parts of a multipart/form-data body (RFC 7578). A delimiter counts only at the start of a line, and
 * lines may end in CRLF or LF. A `model` field names its value; a file part is read as a batch file.
 */
function readMultipart(body: Buffer, boundary: string, state: State): boolean {
  const dash = Buffer.from(`--${boundary}`);
  const lineDash = Buffer.from(`\n--${boundary}`);
  let at = body.subarray(0, dash.length).equals(dash) ? 0 : body.indexOf(lineDash);
  if (at < 0) return true; // no part at all: nothing named
  if (at > 0) at += 1;
  for (;;) {
    const partStart = at + dash.length;
    if (body[partStart] === 0x2d && body[partStart + 1] === 0x2d) return true; // the closing delimiter
    let next = body.indexOf(lineDash, partStart);
    if (next < 0) return false; // a part never closed: where it ends is a guess
    const part = body.subarray(partStart, next + 1);
    const headerEnd = headersEnd(part);
    if (headerEnd === null) return false;
    const headers = part.toString('latin1', 0, headerEnd.at);
    let content = part.subarray(headerEnd.at + headerEnd.length);
    // The line break before the next delimiter belongs to the delimiter.
    if (content[content.length - 1] === 0x0a)
      content = content.subarray(0, content[content.length - 2] === 0x0d ? -2 : -1);
    const { names, filename } = disposition(headers);
    if (names.some((n) => n.toLowerCase() === 'model')) state.out.push(content.toString('utf8').trim());
    else if (!readBatchFile(content, state, filename === null || /\.jsonl?$/i.test(filename))) return false;
    next += 1;
    at = next;
  }
}

/** Where a part's headers end (a blank line, CRLF or LF), within MAX_PART_HEADERS; null past it. */
function headersEnd(part: Buffer): { at: number; length: number } | null {
  const limit = Math.min(part.length, MAX_PART_HEADERS);
  for (let i = 0; i < limit; i++) {
    if (part[i] !== 0x0a) continue;
    if (part[i + 1] === 0x0a) return { at: i + 1, length: 1 };
    if (part[i + 1] === 0x0d && part[i + 2] === 0x0a) return { at: i + 1, length: 2 };
  }
  return null;
}

/** The `name` of every Content-Disposition header of a part (quoted or not), and its file name if any. */
function disposition(headers: string): { names: string[]; filename: string | null } {
  const names: string[] = [];
  let filename: string | null = null;
  for (const line of headers.split(/\r?\n/)) {
    const colon = line.indexOf(':');
    if (colon < 0 || line.slice(0, colon).trim().toLowerCase() !== 'content-disposition') continue;
    // Parameters split on `;` outside quotes; each is `name=value`.
    for (const param of line
      .slice(colon + 1)
      .split(';')
      .slice(1)) {
      const eq = param.indexOf('=');
      if (eq < 0) continue;
      const key = param.slice(0, eq).trim().toLowerCase();
      const value = param
        .slice(eq + 1)
        .trim()
        .replace(/^"(.*)"$/, '$1');
      if (key === 'name') names.push(value);
      else if (key === 'filename' || key === 'filename*') filename = value;
    }
  }
  return { names, filename };
}

/** Walks the value without recursion; false when it branches past the budget. */
function collect(root: unknown, state: State, isModelKey: (key: string) => boolean): boolean {
  const stack: [unknown, number][] = [[root, 0]];
  while (stack.length > 0) {
    if (--state.nodes < 0) return false;
    const [value, depth] = stack.pop()!;
    if (value === null || typeof value !== 'object' || depth > MAX_DEPTH) continue;
    if (Array.isArray(value)) {
      for (const item of value) if (item !== null && typeof item === 'object') stack.push([item, depth + 1]);
      continue;
    }
    for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
      if (typeof item === 'string') {
        if (isModelKey(key)) state.out.push(item);
      } else if (item !== null && typeof item === 'object') {
        stack.push([item, depth + 1]);
      }
    }
  }
  return true;
}
