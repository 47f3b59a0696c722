import { formatSse } from '../../../core/sse.ts';
import { type SseFrame, objectOf } from './sse-frames.ts';
import type { CallOutcome, CallTracker, StreamToolFormat } from './stream-gate.ts';

// Anthropic Messages streams for the tool gate (stream-gate.ts). A call is a `tool_use` content block:
// content_block_start (id, name), input_json_delta deltas (its arguments), content_block_stop (whole).
// Blocks come one after another; each is its own call; a delta for a block already stopped is dropped. A refused block becomes a `text` block at the
// same index carrying the message (start + one text_delta, its stop kept); its deltas are dropped.
// message_delta's stop_reason `tool_use` becomes `end_turn` when no allowed call remains.

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

  read(frame: SseFrame, calls: CallTracker): readonly number[] {
    const e = objectOf(frame);
    if (e === null) return NONE;
    if (e.type === 'message_start') return this.#readStart(e, calls);
    const index = e.index;
    if (typeof index !== 'number') return NONE;
    if (e.type === 'content_block_start') {
      const block = e.content_block as Record<string, unknown> | undefined;
      if (block?.type !== 'tool_use') return NONE;
      const seq = calls.open();
      this.#indexOf[seq] = index;
      this.#open.set(index, {
        seq,
        id: String(block.id ?? ''),
        name: String(block.name ?? ''),
        parts: [],
        input: block.input,
      });
      return [seq];
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
    if (e.type === 'content_block_stop') {
      this.#open.delete(index);
      this.#closed.set(index, call.seq);
      const args = call.parts.length > 0 ? call.parts.join('') : JSON.stringify(call.input ?? {});
      calls.whole(call.seq, { id: call.id, name: call.name, arguments: args });
      return [call.seq];
    }
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
