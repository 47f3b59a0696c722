import { formatSse } from '../../../core/sse.ts';
import { CALL_ITEMS, callArguments, callName, denialItem, isCallItem } from './plain-openai-responses.ts';
import { type SseFrame, objectOf } from './sse-frames.ts';
import type { CallOutcome, CallTracker, StreamToolFormat } from './stream-gate.ts';

// OpenAI Responses streams for the tool gate (stream-gate.ts). A call is a `function_call` output item
// (or a `custom_tool_call`, its free-text `input` in place of `arguments`): response.output_item.added,
// function_call_arguments.delta/.done (custom_tool_call_input.delta/.done), response.output_item.done
// (whole: its item's arguments are what is decided, and must agree with the deltas and `.done`, else
// the call is refused). A refused item becomes the plain answers' `message` item (denialItem: role
// assistant, one output_text part carrying the message, id msg_dvx_<item id>) at the same output_index: `added` where the call's was, the text part's events and the
// item's `done` where the call's `done` was; its argument events are dropped. The response objects of
// response.created/in_progress/completed/incomplete/failed list the items: their function_call items
// are rewritten the same way, and one the stream never announced, or whose arguments differ from the
// decided ones, is refused. `sequence_number` is renumbered after a change so it stays gapless.
//
// Where an item is: the SDK pushes each added item at the next position of `output` (whatever its
// `output_index`), and replaces the item at an event's `output_index` with a `.done` item. The gate
// reads positions the same way: a call item added under an index that is not its position, or carried
// by an `output_item.done` for a position that holds no call (or a call of another type), is refused
// by the gate and goes out as the denial's message item; an event whose `output_index` is not a whole
// number naming an added item is dropped; another item added under the wrong index goes out with its
// position.

type Obj = Record<string, unknown>;

interface Call {
  seq: number;
  /** The item as announced (its id and call_id name the denial item). */
  item: Obj;
  itemId: string;
  callId: string;
  name: string;
  outputIndex: number;
  parts: string[];
  done: string | null;
}

/** The client-run call items (plain-openai-responses.ts), and the field holding each one's arguments. */
const argsOf = (item: Obj): unknown => item[CALL_ITEMS[item.type as string]];
const isCall = isCallItem;
const NONE: readonly number[] = [];
const EMPTY = Buffer.alloc(0);
const RESPONSE_EVENTS = new Set([
  'response.created',
  'response.queued',
  'response.in_progress',
  'response.completed',
  'response.incomplete',
  'response.failed',
]);

export class ResponsesToolStream implements StreamToolFormat {
  readonly format = 'openai-responses' as const;
  readonly keepAlive = Buffer.from(': keep-alive\n\n');
  #byOutput = new Map<number, Call>();
  #byCallId = new Map<string, Call>();
  #calls: Call[] = [];
  /** Per response event: the seq replacing each function_call item of its `output` (by position). */
  #outputs = new WeakMap<SseFrame, Map<number, number>>();
  /** Events of a call that came after it was whole. */
  #late = new WeakSet<SseFrame>();
  /** Events out minus events in so far: added to upstream sequence numbers. */
  #shift = 0;
  /** The response's id, from its first response event. */
  answerId: string | null = null;

  isCustom(seq: number): boolean {
    return this.#calls[seq]?.item.type === 'custom_tool_call';
  }
  /** Items in the response so far: the position the next added item takes. */
  #items = 0;
  /** Events carrying a call item the gate refuses itself, with its seq and position. */
  #stray = new WeakMap<SseFrame, { seq: number; at: number }>();
  /** Items other than calls added under an index that is not their position: sent with the position. */
  #moved = new WeakMap<SseFrame, number>();
  /** Events no client may read (an output_index naming no item): dropped. */
  #dropped = new WeakSet<SseFrame>();

  read(frame: SseFrame, calls: CallTracker): readonly number[] {
    const e = objectOf(frame);
    if (e === null || typeof e.type !== 'string') return NONE;
    if (RESPONSE_EVENTS.has(e.type)) {
      const output = (e.response as Obj | undefined)?.output;
      this.#items = Array.isArray(output) ? output.length : 0;
      return this.#readResponse(frame, e, calls);
    }
    if (e.type === 'response.output_item.added') {
      const at = this.#items++;
      const item = e.item;
      if (!isCall(item)) {
        if (e.output_index !== at) this.#moved.set(frame, at);
        return NONE;
      }
      if (e.output_index !== at) return this.#refuseStray(frame, item, at, calls);
      const first = argsOf(item);
      const call: Call = {
        seq: calls.open(),
        item,
        itemId: String(item.id ?? ''),
        callId: String(item.call_id ?? ''),
        name: callName(item),
        outputIndex: at,
        parts: typeof first === 'string' && first !== '' ? [first] : [],
        done: null,
      };
      this.#calls[call.seq] = call;
      this.#byOutput.set(call.outputIndex, call);
      this.#byCallId.set(call.callId, call);
      return [call.seq];
    }
    if (!Object.hasOwn(e, 'output_index')) return NONE;
    const at = e.output_index;
    if (typeof at !== 'number' || !Number.isInteger(at) || at < 0 || at >= this.#items) {
      this.#dropped.add(frame);
      return NONE;
    }
    const call = this.#byOutput.get(at);
    if (call === undefined) {
      // A call item done where no call was added: the SDK would put it in that item's place.
      if (e.type === 'response.output_item.done' && isCall(e.item)) return this.#refuseStray(frame, e.item, at, calls);
      return NONE;
    }
    const open = calls.calls[call.seq].state === 'open';
    // Once the call is whole, more of its arguments would change what was decided: they never go out.
    if (!open) {
      this.#late.add(frame);
      return [call.seq];
    }
    const kind = e.type.startsWith('response.custom_tool_call_input.') ? 'input' : 'arguments';
    if (e.type === `response.${kind === 'input' ? 'custom_tool_call_input' : 'function_call_arguments'}.delta`) {
      if (typeof e.delta === 'string') call.parts.push(e.delta);
    } else if (e.type === `response.${kind === 'input' ? 'custom_tool_call_input' : 'function_call_arguments'}.done`) {
      if (typeof e[kind] === 'string') call.done = e[kind] as string;
    } else if (e.type === 'response.output_item.done') {
      const item = (e.item ?? {}) as Obj;
      const joined = call.parts.join('');
      const final = argsOf({ ...item, type: call.item.type });
      const args =
        typeof final === 'string'
          ? final
          : final !== null && typeof final === 'object'
            ? callArguments({ ...item, type: call.item.type })
            : (call.done ?? joined);
      const named = { id: call.callId, name: call.name, arguments: args };
      if (
        item.type !== call.item.type ||
        (call.parts.length > 0 && joined !== args) ||
        (call.done !== null && call.done !== args) ||
        (item.call_id !== undefined && item.call_id !== call.callId) ||
        (item.name !== undefined && item.name !== call.name)
      )
        calls.refuse(call.seq, named, 'its arguments were not streamed consistently');
      else calls.whole(call.seq, named);
    }
    return [call.seq];
  }

  /** A call item the stream does not carry the way the API does: refused, never decided. */
  #refuseStray(frame: SseFrame, item: Obj, at: number, calls: CallTracker): readonly number[] {
    const seq = calls.open();
    const named = {
      id: String(item.call_id ?? ''),
      name: callName(item),
      arguments: callArguments(item),
    };
    calls.refuse(seq, named, 'it was not streamed as an output item');
    this.#stray.set(frame, { seq, at });
    return [seq];
  }

  /** A response object: each function_call item in its output must be a decided call, as decided. */
  #readResponse(frame: SseFrame, e: Obj, calls: CallTracker): readonly number[] {
    const id = (e.response as Obj | undefined)?.id;
    if (this.answerId === null && typeof id === 'string') this.answerId = id;
    const output = (e.response as Obj | undefined)?.output;
    if (!Array.isArray(output)) return NONE;
    let seqs: number[] | null = null;
    const replace = new Map<number, number>();
    output.forEach((item: unknown, i) => {
      if (!isCall(item)) return;
      const it = item;
      const known = this.#byCallId.get(String(it.call_id ?? ''));
      const named = {
        id: String(it.call_id ?? ''),
        name: callName(it),
        arguments: callArguments(it),
      };
      let seq: number;
      if (known === undefined || calls.calls[known.seq].state === 'open') {
        seq = calls.open();
        calls.refuse(seq, named, 'it was not streamed as an output item');
      } else {
        const decided = calls.calls[known.seq].call;
        if (decided !== null && (decided.arguments !== named.arguments || decided.name !== named.name)) {
          seq = calls.open();
          calls.refuse(seq, named, 'the final response changed its arguments');
        } else seq = known.seq;
      }
      replace.set(i, seq);
      (seqs ??= []).push(seq);
    });
    if (replace.size > 0) this.#outputs.set(frame, replace);
    return seqs ?? NONE;
  }

  render(frame: SseFrame, seqs: readonly number[], calls: readonly CallOutcome[]): Buffer {
    const e = frame.parsed as Obj | null | undefined;
    if (e === null || e === undefined) return frame.raw;
    if (RESPONSE_EVENTS.has(e.type as string)) return this.#renderResponse(frame, e, calls);
    if (this.#dropped.has(frame)) return this.#renumber(frame, e, []);
    const moved = this.#moved.get(frame);
    if (moved !== undefined) return this.#renumber(frame, e, [{ ...e, output_index: moved }]);
    const stray = this.#stray.get(frame);
    if (stray !== undefined)
      return this.#renumber(frame, e, [
        { ...e, output_index: stray.at, item: denialItem(e.item as Obj, calls[stray.seq].message) },
      ]);
    if (seqs.length === 0) return this.#renumber(frame, e, [e]);
    const call = this.#calls[seqs[0]];
    const outcome = calls[seqs[0]];
    if (this.#late.has(frame)) return this.#renumber(frame, e, []);
    if (outcome.state === 'allowed') return this.#renumber(frame, e, [e]);
    if (outcome.state === 'dropped') return this.#renumber(frame, e, []);
    const text = outcome.message;
    const done = denialItem(call.item, text);
    const base = { item_id: done.id, output_index: call.outputIndex };
    const part = { type: 'output_text', text, annotations: [] };
    if (e.type === 'response.output_item.added')
      return this.#renumber(frame, e, [{ ...e, item: { ...done, status: 'in_progress', content: [] } }]);
    if (e.type === 'response.output_item.done')
      return this.#renumber(frame, e, [
        { type: 'response.content_part.added', ...base, content_index: 0, part: { ...part, text: '' } },
        { type: 'response.output_text.delta', ...base, content_index: 0, delta: text, logprobs: [] },
        { type: 'response.output_text.done', ...base, content_index: 0, text, logprobs: [] },
        { type: 'response.content_part.done', ...base, content_index: 0, part },
        { ...e, item: done },
      ]);
    return this.#renumber(frame, e, []);
  }

  #renderResponse(frame: SseFrame, e: Obj, calls: readonly CallOutcome[]): Buffer {
    const replace = this.#outputs.get(frame);
    if (replace === undefined) return this.#renumber(frame, e, [e]);
    const response = e.response as Obj;
    let changed = false;
    const output: unknown[] = [];
    (response.output as unknown[]).forEach((item, i) => {
      const seq = replace.get(i);
      const outcome = seq === undefined ? undefined : calls[seq];
      if (outcome === undefined || outcome.state === 'allowed') output.push(item);
      else {
        changed = true;
        if (outcome.state === 'refused') output.push(denialItem(item as Obj, outcome.message));
      }
    });
    return this.#renumber(frame, e, [changed ? { ...e, response: { ...response, output } } : e]);
  }

  /**
   * What goes out for an upstream event `e`: the events `out` (the first in its place, the others
   * after it), numbered on from its sequence_number; its own bytes when it is unchanged.
   */
  #renumber(frame: SseFrame, e: Obj, out: Obj[]): Buffer {
    const seq = e.sequence_number;
    if (typeof seq !== 'number') {
      if (out.length === 1 && out[0] === e) return frame.raw;
      return Buffer.from(out.map((o) => formatSse(o.type as string, o)).join(''));
    }
    const first = seq + this.#shift;
    this.#shift += out.length - 1;
    if (out.length === 1 && out[0] === e && first === seq) return frame.raw;
    if (out.length === 0) return EMPTY;
    return Buffer.from(
      out
        .map((o, i) => {
          const { type, sequence_number: _, ...rest } = o;
          return formatSse(type as string, { type, sequence_number: first + i, ...rest });
        })
        .join(''),
    );
  }
}
