import { formatSse } from '../../../core/sse.ts';
import { type SseFrame, objectOf } from './sse-frames.ts';
import type { CallOutcome, CallTracker, StreamToolFormat } from './stream-gate.ts';

// Anthropic Messages streams for the tool gate (stream-gate.ts). A call is a `tool_use` content block:
// content_block_start (id, name), input_json_delta deltas (its arguments), content_block_stop (whole).
// Blocks come one after another; each is its own call; a delta for a block already stopped is dropped. A refused block becomes a `text` block at the
// same index carrying the message (start + one text_delta, its stop kept); its deltas are dropped.
// message_delta's stop_reason `tool_use` becomes `end_turn` when no allowed call remains.
//
// Where a block is: the official SDKs put each started block at the next position of the message's
// content (after message_start's own content), whatever `index` its start says, and apply a delta to
// the block at the delta's `index` (`"1"` as much as `1`). The gate reads positions the same way, and
// what the API never sends is not let through: a tool_use block started under an index that is not
// its position is refused (a client keyed by `index` would read it elsewhere); another block's start
// goes out with its position as index; a delta or stop whose index is not a whole number naming a
// started block is dropped.

interface OpenCall {
  seq: number;
  id: string;
  name: string;
  parts: string[];
  /** The start's `input`, the arguments when no delta comes. */
  input: unknown;
}

const NONE: readonly number[] = [];
const EMPTY = Buffer.alloc(0);

export class AnthropicToolStream implements StreamToolFormat {
  readonly format = 'anthropic-messages' as const;
  readonly keepAlive = Buffer.from('event: ping\ndata: {"type": "ping"}\n\n');
  /** Open tool_use blocks by content index. */
  #open = new Map<number, OpenCall>();
  /** Every call's content index, by seq. */
  #indexOf: number[] = [];
  /** Stopped tool_use blocks by content index, and the deltas that came for them after. */
  #closed = new Map<number, number>();
  #late = new WeakSet<SseFrame>();
  /** The message's id, from message_start. */
  answerId: string | null = null;
  /** Blocks in the message so far: the position the next started block takes. */
  #blocks = 0;
  /** Events no client may read (a delta or stop under an index naming no block): dropped. */
  #dropped = new WeakSet<SseFrame>();
  /** Starts of blocks other than tool_use whose index was not their position: sent with the position. */
  #moved = new WeakMap<SseFrame, number>();

  read(frame: SseFrame, calls: CallTracker): readonly number[] {
    const e = objectOf(frame);
    if (e === null) return NONE;
    if (e.type === 'message_start') return this.#readStart(e, calls);
    if (e.type === 'content_block_start') {
      const at = this.#blocks++;
      const block = e.content_block as Record<string, unknown> | undefined;
      if (block?.type !== 'tool_use') {
        if (e.index !== at) this.#moved.set(frame, at);
        return NONE;
      }
      const seq = calls.open();
      this.#indexOf[seq] = at;
      const call = { seq, id: String(block.id ?? ''), name: String(block.name ?? ''), parts: [], input: block.input };
      if (e.index !== at) {
        calls.refuse(
          seq,
          { id: call.id, name: call.name, arguments: JSON.stringify(call.input ?? {}) },
          'its content block index was not its position in the message',
        );
        this.#closed.set(at, seq);
      } else this.#open.set(at, call);
      return [seq];
    }
    if (e.type !== 'content_block_delta' && e.type !== 'content_block_stop') return NONE;
    const index = e.index;
    if (typeof index !== 'number' || !Number.isInteger(index) || index < 0 || index >= this.#blocks) {
      this.#dropped.add(frame);
      return NONE;
    }
    const call = this.#open.get(index);
    if (call === undefined) {
      // A delta for a tool_use block already stopped would change what was decided: it never goes out.
      const closed = this.#closed.get(index);
      if (closed === undefined || e.type !== 'content_block_delta') return NONE;
      this.#late.add(frame);
      return [closed];
    }
    if (e.type === 'content_block_delta') {
      const delta = e.delta as Record<string, unknown> | undefined;
      if (delta?.type === 'input_json_delta' && typeof delta.partial_json === 'string')
        call.parts.push(delta.partial_json);
      return [call.seq];
    }
    this.#open.delete(index);
    this.#closed.set(index, call.seq);
    // The SDKs take the deltas' text when there is any, else the start's input (deltas of '' read as
    // `{}` by one SDK, as the start's input by another: refused when those differ).
    const joined = call.parts.join('');
    const input = JSON.stringify(call.input ?? {});
    const named = { id: call.id, name: call.name, arguments: joined !== '' ? joined : input };
    if (joined === '' && call.parts.length > 0 && input !== '{}')
      calls.refuse(call.seq, named, 'its arguments were not streamed consistently');
    else calls.whole(call.seq, named);
    return [call.seq];
  }

  /**
   * message_start's message is the SDKs' starting snapshot: a tool_use already in its content was never
   * streamed as a block, so it is refused (the API sends `content: []`).
   */
  #readStart(e: Record<string, unknown>, calls: CallTracker): readonly number[] {
    const id = (e.message as Record<string, unknown> | undefined)?.id;
    if (this.answerId === null && typeof id === 'string') this.answerId = id;
    const content = (e.message as Record<string, unknown> | undefined)?.content;
    this.#blocks = Array.isArray(content) ? content.length : 0;
    if (!Array.isArray(content)) return NONE;
    const seqs: number[] = [];
    for (const block of content) {
      if (block === null || typeof block !== 'object' || (block as Record<string, unknown>).type !== 'tool_use')
        continue;
      const b = block as Record<string, unknown>;
      const seq = calls.open();
      const call = { id: String(b.id ?? ''), name: String(b.name ?? ''), arguments: JSON.stringify(b.input ?? {}) };
      calls.refuse(seq, call, 'it was not streamed as a content block');
      seqs.push(seq);
    }
    return seqs.length > 0 ? seqs : NONE;
  }

  render(frame: SseFrame, seqs: readonly number[], calls: readonly CallOutcome[]): Buffer {
    const e = frame.parsed as Record<string, unknown> | null | undefined;
    if (e?.type === 'message_start' && seqs.length > 0) {
      const message = e.message as Record<string, unknown>;
      let n = 0;
      const content = (message.content as unknown[]).map((block) =>
        block !== null && typeof block === 'object' && (block as Record<string, unknown>).type === 'tool_use'
          ? { type: 'text', text: calls[seqs[n++]].message }
          : block,
      );
      return Buffer.from(formatSse(frame.event, { ...e, message: { ...message, content } }));
    }
    if (this.#dropped.has(frame)) return EMPTY;
    const moved = this.#moved.get(frame);
    if (moved !== undefined) return Buffer.from(formatSse(frame.event, { ...e, index: moved }));
    if (seqs.length === 0) {
      if (e?.type !== 'message_delta') return frame.raw;
      const delta = e.delta as Record<string, unknown> | undefined;
      if (delta?.stop_reason !== 'tool_use' || calls.some((c) => c.state === 'allowed')) return frame.raw;
      return Buffer.from(formatSse(frame.event, { ...e, delta: { ...delta, stop_reason: 'end_turn' } }));
    }
    const outcome = calls[seqs[0]];
    if (this.#late.has(frame)) return EMPTY;
    if (outcome.state === 'allowed') return frame.raw;
    if (outcome.state === 'dropped') return EMPTY;
    // Refused: the block's start becomes a text block with the message; its deltas go; its stop stays.
    if (e!.type === 'content_block_start') {
      const index = this.#indexOf[seqs[0]];
      return Buffer.from(
        formatSse('content_block_start', {
          type: 'content_block_start',
          index,
          content_block: { type: 'text', text: '' },
        }) +
          formatSse('content_block_delta', {
            type: 'content_block_delta',
            index,
            delta: { type: 'text_delta', text: outcome.message },
          }),
      );
    }
    return e!.type === 'content_block_stop' ? frame.raw : EMPTY;
  }
}
