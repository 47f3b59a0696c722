import { deepScanView } from './json-view.ts';

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
// .arguments / function_call.arguments, and the compatible upstreams' .reasoning_content / .reasoning)
// and OpenAI responses (`*.delta` events). Blocks are separated by a newline so text of
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
  /** OpenAI chat: the choice the block belongs to (its finish_reason stops all of the choice's blocks). */
  choice?: string;
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
      if (typeof d.content === 'string') out.push({ key: `c${idx}`, text: d.content, choice: idx });
      if (typeof d.refusal === 'string') out.push({ key: `c${idx}r`, text: d.refusal, choice: idx });
      // OpenAI-compatible upstreams stream their reasoning in `reasoning_content` (DeepSeek, vLLM) or
      // `reasoning` (OpenRouter).
      if (typeof d.reasoning_content === 'string')
        out.push({ key: `c${idx}_`, text: d.reasoning_content, choice: idx });
      if (typeof d.reasoning === 'string') out.push({ key: `c${idx}k`, text: d.reasoning, choice: idx });
      // The legacy `functions` API: one call per choice, its arguments in `function_call`.
      const legacy = (d.function_call as Record<string, unknown> | undefined)?.arguments;
      if (typeof legacy === 'string') out.push({ key: `c${idx}f`, text: legacy, json: true, choice: idx });
      if (Array.isArray(d.tool_calls)) {
        for (const call of d.tool_calls as Record<string, unknown>[]) {
          const args = (call?.function as Record<string, unknown> | undefined)?.arguments;
          if (typeof args === 'string')
            out.push({ key: `c${idx}t${String(call.index ?? 0)}`, text: args, json: true, choice: idx });
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
export function sseText(body: Buffer, onGiveUp?: () => void): Buffer | null {
  // Only a line holding `data:` is read (#line), so a body without one (a JSON answer) joins nothing
  // and refuses no line: one native search says so, where the joiner's set-up and its copy of the
  // last line cost more than the rest of a small answer's scan.
  if (body.indexOf(DATA) < 0) return null;
  const joiner = new SseJoiner(onGiveUp);
  joiner.push(body);
  joiner.end();
  return joiner.joined();
}

/** One block of a stream's joined text (a content block, a choice's text or tool call, an item). */
export interface JoinedBlock {
  key: string;
  texts: string[];
  json: boolean;
  /** Its stop event arrived (content_block_stop, `*.done`, a finish_reason): no more text expected. */
  stopped: boolean;
}

const STOP_MARKS = [Buffer.from('content_block_stop'), Buffer.from('.done"'), Buffer.from('finish_reason')];
/** What a line is searched for: `data:`, then the stop marks (SseJoiner's #next keeps a search of each). */
const NEEDLES = [DATA, ...STOP_MARKS];

/**
 * sseText fed as the stream arrives (docs/decisions.md, "A streamed answer inspected as it arrives"):
 * each complete line is read once, when its newline arrives; the last line without one at end().
 * sseText is this class fed the whole body at once, so both read the same pieces in the same order.
 * It also notes when a block's stop event arrives, so the block's text can be scanned then; a block
 * that grows after its stop (an upstream out of the ordinary) is seen to (`texts.length`).
 */
export class SseJoiner {
  readonly #onGiveUp: (() => void) | undefined;
  /** The chunks of the line not ended yet. */
  #carry: Buffer[] = [];
  #bad = 0;
  #pieces = 0;
  readonly #blocks = new Map<string, JoinedBlock>();
  /** OpenAI chat: each choice's blocks not stopped yet (a finish_reason touches only those). */
  readonly #openByChoice = new Map<string, JoinedBlock[]>();
  /** Blocks stopped since takeStopped() was last called, in the order they stopped. */
  #stoppedSince: JoinedBlock[] = [];
  /** Blocks that received text since takeGrown() was last called. */
  #grownSince = new Set<JoinedBlock>();
  #ended = false;
  /**
   * The last search for each needle (`data:`, then each of STOP_MARKS) in this push (#next): in which
   * bytes, from where, and what it found.
   */
  #searched: Buffer | null = null;
  #searchedFrom = [-1, -1, -1, -1];
  #found = [-1, -1, -1, -1];

  constructor(onGiveUp?: () => void) {
    this.#onGiveUp = onGiveUp;
  }

  /** Pieces read so far (the joined text is null below two). */
  get pieces(): number {
    return this.#pieces;
  }

  /** Whether more than MAX_BAD_LINES lines were refused (the rest of the stream is not read). */
  get gaveUp(): boolean {
    return this.#bad >= MAX_BAD_LINES;
  }

  /** The blocks in the order they first appeared (the joined text's order). */
  blocks(): IterableIterator<JoinedBlock> {
    return this.#blocks.values();
  }

  /**
   * The blocks whose stop event arrived since the last call (each once: a block stops once). A stop
   * costs only the blocks it stops, so a stream of many blocks and many stop events stays linear.
   */
  takeStopped(): JoinedBlock[] {
    const out = this.#stoppedSince;
    this.#stoppedSince = [];
    return out;
  }

  /** The blocks that received text since the last call (each once per call). */
  takeGrown(): Set<JoinedBlock> {
    const out = this.#grownSince;
    if (out.size > 0) this.#grownSince = new Set();
    return out;
  }

  /** The first block: the only one not preceded by a newline in the joined text. */
  get first(): JoinedBlock | undefined {
    return this.#blocks.values().next().value;
  }

  push(chunk: Buffer): void {
    if (this.#ended) throw new Error('SseJoiner: push after end');
    this.#searched = null; // a search is reused within one call only (a caller may reuse its buffer)
    let nl = chunk.indexOf(0x0a);
    if (nl < 0) {
      // A line still open is kept as its chunks (never copied again per chunk: a long line stays linear).
      if (chunk.length > 0) this.#carry.push(chunk);
      return;
    }
    let from = 0;
    if (this.#carry.length > 0) {
      const line = Buffer.concat([...this.#carry, chunk.subarray(0, nl)]);
      this.#carry = [];
      this.#line(line, 0, line.length);
      from = nl + 1;
      nl = chunk.indexOf(0x0a, from);
    }
    for (; nl >= 0; nl = chunk.indexOf(0x0a, from)) {
      this.#line(chunk, from, nl);
      from = nl + 1;
    }
    if (from < chunk.length) this.#carry.push(chunk.subarray(from));
  }

  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#searched = null;
    if (this.#carry.length > 0) {
      const line = Buffer.concat(this.#carry);
      this.#carry = [];
      this.#line(line, 0, line.length);
    }
  }

  /** The joined text as sseText gives it: every block, a newline between two. */
  joined(): Buffer | null {
    if (this.#pieces < 2) return null;
    const out: Buffer[] = [];
    for (const block of this.#blocks.values()) {
      if (out.length > 0) out.push(NEWLINE);
      out.push(blockView(block));
    }
    return Buffer.concat(out);
  }

  /**
   * The line [start, end) of `data` (end at its newline, or the body's end): the first `data:` in it
   * that starts the line or follows a carriage return, read to the line's end (as sseText reads).
   */
  #line(data: Buffer, start: number, end: number): void {
    let at = this.#next(0, data, start);
    while (at >= 0 && at < end && at !== start && data[at - 1] !== 0x0d) at = this.#next(0, data, at + 1);
    if (at < 0 || at + DATA.length > end) return;
    let from = at + DATA.length;
    if (data[from] === 0x20) from++;
    const stop = data[end - 1] === 0x0d ? end - 1 : end;
    if (data[from] !== 0x7b || this.#bad >= MAX_BAD_LINES) return;
    if (mayCarryDelta(data, from, stop)) {
      let event: unknown;
      try {
        event = JSON.parse(data.toString('utf8', from, stop));
      } catch {
        // not JSON: nothing to join
        if (++this.#bad === MAX_BAD_LINES) this.#onGiveUp?.();
        return;
      }
      this.#add(event);
      this.#stops(event);
    } else if (
      this.#within(1, data, from, stop) ||
      this.#within(2, data, from, stop) ||
      this.#within(3, data, from, stop)
    ) {
      // A stop event carries no delta: read only to learn a block is done (never counted as refused).
      try {
        this.#stops(JSON.parse(data.toString('utf8', from, stop)));
      } catch {
        // not JSON: no block ends here
      }
    }
  }

  /**
   * The first occurrence of NEEDLES[k] at or after `from` in `data`, as data.indexOf gives it. A
   * line's search runs on past the line's end to the next occurrence, wherever it is: remembered, the
   * lines up to it reuse that search instead of each walking the rest of the chunk again (a body of
   * many lines and no `data:`, or a stream of pings with no `.done"`, cost a walk of the rest per
   * line: quadratic, seconds for a 1.5 MB stream).
   */
  #next(k: number, data: Buffer, from: number): number {
    if (data !== this.#searched) {
      this.#searched = data;
      this.#searchedFrom.fill(-1);
    }
    const found = this.#found[k];
    const searchedFrom = this.#searchedFrom[k];
    if (searchedFrom >= 0 && from >= searchedFrom && (found < 0 || found >= from)) return found;
    const at = data.indexOf(NEEDLES[k], from);
    this.#searchedFrom[k] = from;
    this.#found[k] = at;
    return at;
  }

  /** Whether NEEDLES[k] lies within [from, to) of `data` (its first occurrence from `from` does). */
  #within(k: number, data: Buffer, from: number, to: number): boolean {
    const i = this.#next(k, data, from);
    return i >= 0 && i + NEEDLES[k].length <= to;
  }

  #add(event: unknown): void {
    const out: Piece[] = [];
    pieces(event, out);
    for (const p of out) {
      let block = this.#blocks.get(p.key);
      if (!block) {
        this.#blocks.set(p.key, (block = { key: p.key, texts: [], json: false, stopped: false }));
        if (p.choice !== undefined) {
          const open = this.#openByChoice.get(p.choice);
          if (open === undefined) this.#openByChoice.set(p.choice, [block]);
          else open.push(block);
        }
      }
      block.texts.push(p.text);
      if (p.json) block.json = true;
      this.#grownSince.add(block);
      this.#pieces++;
    }
  }

  #stops(event: unknown): void {
    if (event === null || typeof event !== 'object') return;
    const e = event as Record<string, unknown>;
    const stop = (block: JoinedBlock | undefined) => {
      if (block === undefined || block.stopped) return;
      block.stopped = true;
      this.#stoppedSince.push(block);
    };
    if (e.type === 'content_block_stop') stop(this.#blocks.get(`a${String(e.index ?? 0)}`));
    else if (typeof e.type === 'string' && e.type.endsWith('.done'))
      stop(this.#blocks.get(`r${String(e.item_id ?? e.output_index ?? '')}:${String(e.content_index ?? '')}`));
    else if (Array.isArray(e.choices)) {
      for (const choice of e.choices as Record<string, unknown>[]) {
        if (choice?.finish_reason === null || choice?.finish_reason === undefined) continue;
        const idx = String(choice.index ?? 0);
        const open = this.#openByChoice.get(idx);
        if (open === undefined) continue;
        this.#openByChoice.delete(idx);
        for (const block of open) stop(block);
      }
    }
  }
}

/** A block's text as the joined text holds it (JSON fragments decoded once joined). */
export function blockView(block: JoinedBlock): Buffer {
  const joined = Buffer.from(block.texts.join(''), 'utf8');
  return block.json ? deepScanView(joined) : joined;
}
