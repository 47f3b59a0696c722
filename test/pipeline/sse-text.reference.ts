import { deepScanView } from '../../pipeline/json-view.ts';

// The whole-body sseText as it was before the incremental joiner (pipeline/sse-text.ts): the reference
// test/pipeline/stream-inspection.test.ts checks the joiner against.

// A streamed response splits its text into many small events: `sk-ant-api03-` in one delta and the
// rest of the key in the next. Scanning the stream as sent would miss it, so response inspection also
// scans the text the agent actually receives: every delta of every event, joined in order.
//
//   event: content_block_delta            ─┐
//   data: {"delta":{"text":"sk-ant-"}}      ├─▶ "sk-ant-api03-Xy…"  (one view, scanned like a body)
//   data: {"delta":{"text":"api03-Xy…"}}   ─┘
//
// Known delta fields: Anthropic messages (text_delta.text, input_json_delta.partial_json,
// thinking_delta.thinking), OpenAI chat (choices[].delta.content / .refusal / tool_calls[].function
// .arguments) and OpenAI responses (`*.delta` events). Blocks are separated by a newline so text of
// two different blocks never runs together into one token.

const DATA = Buffer.from('data:');
const NEWLINE = Buffer.from('\n');
// A line JSON.parse refuses costs it microseconds (the SyntaxError), a thousand times the bytes it
// read: a stream of `data:{"delta"}` lines would take seconds per megabyte. Only lines that can carry
// a delta are parsed (every known delta field is named `delta`; a `\u` escape could spell it), and
// past this many refused lines the rest of the stream is left to the scan of the body as sent, and
// the scan reports that it gave up (a named failure: the record says the joined text was not read).
export const MAX_BAD_LINES = 1024;

interface Piece {
  key: string;
  text: string;
  /** The piece is a fragment of JSON text (tool-call arguments): the joined block is decoded too. */
  json?: boolean;
}

function pieces(event: unknown, out: Piece[]): void {
  if (event === null || typeof event !== 'object') return;
  const e = event as Record<string, unknown>;
  // Anthropic messages
  const delta = e.delta as Record<string, unknown> | undefined;
  if (e.type === 'content_block_delta' && delta && typeof delta === 'object') {
    const key = `a${String(e.index ?? 0)}`;
    for (const field of ['text', 'partial_json', 'thinking']) {
      if (typeof delta[field] === 'string')
        out.push({ key, text: delta[field] as string, json: field === 'partial_json' });
    }
    return;
  }
  // OpenAI responses: response.output_text.delta, response.function_call_arguments.delta, …
  if (typeof e.type === 'string' && e.type.endsWith('.delta') && typeof e.delta === 'string') {
    out.push({
      key: `r${String(e.item_id ?? e.output_index ?? '')}:${String(e.content_index ?? '')}`,
      text: e.delta,
      json: e.type.endsWith('arguments.delta'),
    });
    return;
  }
  // OpenAI chat completions
  if (Array.isArray(e.choices)) {
    for (const choice of e.choices as Record<string, unknown>[]) {
      const d = choice?.delta as Record<string, unknown> | undefined;
      if (!d || typeof d !== 'object') continue;
      const idx = String(choice.index ?? 0);
      if (typeof d.content === 'string') out.push({ key: `c${idx}`, text: d.content });
      if (typeof d.refusal === 'string') out.push({ key: `c${idx}r`, text: d.refusal });
      if (typeof d.reasoning_content === 'string') out.push({ key: `c${idx}_`, text: d.reasoning_content });
      if (typeof d.reasoning === 'string') out.push({ key: `c${idx}k`, text: d.reasoning });
      const legacy = (d.function_call as Record<string, unknown> | undefined)?.arguments;
      if (typeof legacy === 'string') out.push({ key: `c${idx}f`, text: legacy, json: true });
      if (Array.isArray(d.tool_calls)) {
        for (const call of d.tool_calls as Record<string, unknown>[]) {
          const args = (call?.function as Record<string, unknown> | undefined)?.arguments;
          if (typeof args === 'string') out.push({ key: `c${idx}t${String(call.index ?? 0)}`, text: args, json: true });
        }
      }
    }
  }
}

/**
 * Whether the line can name a delta field: `delta` in it, or a `\u` escape that could spell it.
 * Looked for byte by byte within the line (lines are short; a native call per line costs more).
 */
function mayCarryDelta(body: Buffer, start: number, stop: number): boolean {
  for (let i = start; i < stop - 1; i++) {
    const b = body[i];
    if (b === 0x5c && body[i + 1] === 0x75) return true;
    if (
      b === 0x64 &&
      i + 5 <= stop &&
      body[i + 1] === 0x65 &&
      body[i + 2] === 0x6c &&
      body[i + 3] === 0x74 &&
      body[i + 4] === 0x61
    )
      return true;
  }
  return false;
}

/**
 * The joined delta text of an SSE body, or null when the body is not an event stream of deltas.
 * `onGiveUp` is called when the stream held more than MAX_BAD_LINES lines JSON.parse refused.
 */
export function sseTextReference(body: Buffer, onGiveUp?: () => void): Buffer | null {
  let at = body.indexOf(DATA);
  if (at < 0) return null;
  const parts: Piece[] = [];
  let bad = 0;
  while (at >= 0) {
    if (at === 0 || body[at - 1] === 0x0a || body[at - 1] === 0x0d) {
      let end = body.indexOf(0x0a, at);
      if (end < 0) end = body.length;
      let start = at + DATA.length;
      if (body[start] === 0x20) start++;
      const stop = body[end - 1] === 0x0d ? end - 1 : end;
      if (body[start] === 0x7b && bad < MAX_BAD_LINES && mayCarryDelta(body, start, stop)) {
        try {
          pieces(JSON.parse(body.toString('utf8', start, stop)), parts);
        } catch {
          // not JSON: nothing to join
          if (++bad === MAX_BAD_LINES) onGiveUp?.();
        }
      }
      at = body.indexOf(DATA, end);
    } else {
      at = body.indexOf(DATA, at + 1);
    }
  }
  if (parts.length < 2) return null;
  // Group by block, keeping the order blocks first appear in. A block of JSON text (tool arguments
  // arrive as fragments of a JSON document) is decoded once joined: `\u002d` split across two
  // fragments is an escape only the whole text shows.
  const blocks = new Map<string, { texts: string[]; json: boolean }>();
  for (const p of parts) {
    let block = blocks.get(p.key);
    if (!block) blocks.set(p.key, (block = { texts: [], json: false }));
    block.texts.push(p.text);
    if (p.json) block.json = true;
  }
  const out: Buffer[] = [];
  for (const block of blocks.values()) {
    if (out.length > 0) out.push(NEWLINE);
    const joined = Buffer.from(block.texts.join(''), 'utf8');
    out.push(block.json ? deepScanView(joined) : joined);
  }
  return Buffer.concat(out);
}
