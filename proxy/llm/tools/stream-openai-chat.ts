import { LEGACY_FUNCTION_CALL_ID } from './plain-openai-chat.ts';
import { type SseFrame, objectOf } from './sse-frames.ts';
import type { CallOutcome, CallTracker, StreamToolFormat } from './stream-gate.ts';

// OpenAI chat completion streams for the tool gate (stream-gate.ts). A call is one index of a choice's
// `delta.tool_calls`: its first entry brings id and name, the next ones argument pieces (`function`
// calls, and `custom` ones whose pieces are free-text `input`); or the legacy `delta.function_call`. Like the
// official SDK, a call is whole once another index of the same choice appears, or the choice finishes
// (`finish_reason`), or `[DONE]`; a piece arriving for a call already whole is dropped, so the agent
// runs exactly what was decided. A refused call's entries are removed (the remaining calls re-indexed
// from 0 in order), and its message goes out as a content delta where the call began, after "\n\n"
// when the choice has content before it; `finish_reason` tool_calls becomes stop when the choice has
// no allowed call left (function_call likewise). Every choice of the answer is gated, not only the first.

interface Call {
  seq: number;
  choice: number;
  /** The legacy `delta.function_call` (no index, no id), not one of `tool_calls`. */
  legacy: boolean;
  id: string;
  name: string;
  parts: string[];
}

interface Choice {
  /** Its calls by tool index: open ones and whole ones (a later piece for those is dropped). */
  byIndex: Map<number, Call>;
  /** Seqs of its calls, in order. */
  seqs: number[];
  /** Output side: content went out for it (a message after it starts a new paragraph). */
  wrote: boolean;
}

/** What reading an event learnt, kept for rendering it. */
interface Seen {
  /** Per tool_calls entry (by object): the call it belongs to, and whether it opened it or came late. */
  entries: Map<object, { seq: number; opened: boolean; late: boolean }>;
}

const NONE: readonly number[] = [];
/** The legacy function_call's place among a choice's calls. */
const LEGACY = -1;
const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const EMPTY = Buffer.alloc(0);
type Obj = Record<string, unknown>;

export class ChatToolStream implements StreamToolFormat {
  readonly format = 'openai-chat' as const;
  readonly keepAlive = Buffer.from(': keep-alive\n\n');
  #choices = new Map<number, Choice>();
  #calls: Call[] = [];
  #seen = new WeakMap<SseFrame, Seen>();

  read(frame: SseFrame, calls: CallTracker): readonly number[] {
    if (frame.data === null) return NONE;
    if (frame.data.trim() === '[DONE]') {
      for (const choice of this.#choices.values()) this.#closeAll(choice, calls);
      return NONE;
    }
    const chunk = objectOf(frame);
    if (chunk === null || !Array.isArray(chunk.choices)) return NONE;
    let seqs: number[] | null = null;
    for (const c of chunk.choices as unknown[]) {
      if (c === null || typeof c !== 'object') continue;
      const at = choiceIndex(c as Obj);
      if (at === null) continue;
      const choice = this.#choice(at);
      const delta = (c as Obj).delta as Obj | undefined;
      const entries: Obj[] = [];
      if (delta && Array.isArray(delta.tool_calls)) for (const x of delta.tool_calls) if (isObj(x)) entries.push(x);
      if (delta && isObj(delta.function_call)) entries.push(delta.function_call);
      for (const e of entries) {
        const legacy = e === delta!.function_call;
        const index = legacy ? LEGACY : Number(e.index ?? 0);
        // A function call's name and arguments, or a custom tool call's name and free-text input.
        const fn = legacy ? e : isObj(e.custom) ? e.custom : isObj(e.function) ? e.function : {};
        const piece = typeof fn.arguments === 'string' ? fn.arguments : fn.input;
        let call = choice.byIndex.get(index);
        let opened = false;
        if (call === undefined) {
          // A new index: the calls before it are whole (as the SDK reads them).
          this.#closeAll(choice, calls);
          const id = legacy ? LEGACY_FUNCTION_CALL_ID : '';
          call = { seq: calls.open(), choice: at, legacy, id, name: '', parts: [] };
          this.#calls[call.seq] = call;
          choice.byIndex.set(index, call);
          choice.seqs.push(call.seq);
          opened = true;
        }
        const late = calls.calls[call.seq].state !== 'open';
        if (!late) {
          if (!legacy && typeof e.id === 'string' && e.id !== '') call.id = e.id;
          if (typeof fn.name === 'string' && fn.name !== '') call.name = fn.name;
          if (typeof piece === 'string') call.parts.push(piece);
        }
        let seen = this.#seen.get(frame);
        if (seen === undefined) this.#seen.set(frame, (seen = { entries: new Map() }));
        seen.entries.set(e, { seq: call.seq, opened, late });
        (seqs ??= []).push(call.seq);
      }
      const finish = (c as Obj).finish_reason;
      if (typeof finish === 'string' && finish !== '') this.#closeAll(choice, calls);
    }
    return seqs ?? NONE;
  }

  render(frame: SseFrame, _seqs: readonly number[], calls: readonly CallOutcome[]): Buffer {
    const chunk = frame.parsed as Obj | null | undefined;
    if (chunk === null || chunk === undefined || !Array.isArray(chunk.choices)) return frame.raw;
    const seen = this.#seen.get(frame);
    let changed = false;
    const choices = (chunk.choices as unknown[]).flatMap((c) => {
      if (c === null || typeof c !== 'object') return [c];
      const at = choiceIndex(c as Obj);
      if (at === null) {
        changed = true;
        return [];
      }
      const choice = this.#choice(at);
      const delta = (c as Obj).delta as Obj | undefined;
      let out = c as Obj;
      if (out.index !== at) {
        out = { ...out, index: at };
        changed = true;
      }
      if (delta && seen !== undefined) {
        const next: Obj = { ...delta };
        const messages: string[] = [];
        let touched = false;
        /** Whether the entry stays; a refused call's message where it began. */
        const keep = (entry: unknown): { seq: number } | null => {
          const s = isObj(entry) ? seen.entries.get(entry) : undefined;
          if (s === undefined) return null; // not a call entry: dropped as unreadable
          const outcome = calls[s.seq];
          if (!s.late && outcome.state === 'allowed') return s;
          if (!s.late && s.opened && outcome.state === 'refused') messages.push(outcome.message);
          return null;
        };
        if (Array.isArray(delta.tool_calls)) {
          const entries = delta.tool_calls as unknown[];
          const kept: Obj[] = [];
          for (const entry of entries) {
            const s = keep(entry);
            if (s === null) continue;
            const index = this.#allowedBefore(choice, s.seq, calls);
            kept.push(index === (entry as Obj).index ? (entry as Obj) : { ...(entry as Obj), index });
          }
          if (kept.length !== entries.length || kept.some((k, i) => k !== entries[i])) {
            touched = true;
            if (kept.length > 0) next.tool_calls = kept;
            else delete next.tool_calls;
          }
        }
        if (isObj(delta.function_call) && keep(delta.function_call) === null) {
          touched = true;
          delete next.function_call;
        }
        if (messages.length > 0) {
          const before = typeof delta.content === 'string' ? delta.content : '';
          const lead = choice.wrote || before !== '' ? '\n\n' : '';
          next.content = before + lead + messages.join('\n\n');
          touched = true;
        }
        if (touched) {
          out = { ...out, delta: next };
          changed = true;
        }
      }
      const finish = out.finish_reason;
      if (
        (finish === 'tool_calls' || finish === 'function_call') &&
        !choice.seqs.some((s) => calls[s].state === 'allowed')
      ) {
        out = { ...out, finish_reason: 'stop' };
        changed = true;
      }
      const content = (out.delta as Obj | undefined)?.content;
      if (typeof content === 'string' && content !== '') choice.wrote = true;
      return [out];
    });
    if (!changed) return frame.raw;
    const rewritten = { ...chunk, choices };
    if (emptied(rewritten)) return EMPTY;
    return Buffer.from(
      `${frame.event !== null ? `event: ${frame.event}\n` : ''}data: ${JSON.stringify(rewritten)}\n\n`,
    );
  }

  #choice(index: number): Choice {
    let choice = this.#choices.get(index);
    if (choice === undefined) this.#choices.set(index, (choice = { byIndex: new Map(), seqs: [], wrote: false }));
    return choice;
  }

  #closeAll(choice: Choice, calls: CallTracker): void {
    for (const call of choice.byIndex.values()) {
      if (calls.calls[call.seq].state === 'open')
        calls.whole(call.seq, { id: call.id, name: call.name, arguments: call.parts.join('') });
    }
  }

  /** The index call `seq` has for the agent: how many allowed calls of its choice come before it. */
  #allowedBefore(choice: Choice, seq: number, calls: readonly CallOutcome[]): number {
    let n = 0;
    for (const s of choice.seqs) {
      if (s === seq) break;
      if (calls[s].state === 'allowed' && !this.#calls[s].legacy) n++;
    }
    return n;
  }
}

/**
 * The choice's index as the gate reads it (a missing one is 0), or null when that is no whole number
 * from 0. It goes out as this number: the SDK reads `choices[index]` with the index as it came (a
 * missing one, or `"0x0"`, lands beside the choices; `-1` is the last one to Python), so a choice the
 * gate read as another's could have added pieces to a decided call. One with no such index is dropped.
 */
function choiceIndex(c: Obj): number | null {
  const at = Number(c.index ?? 0);
  return Number.isInteger(at) && at >= 0 ? at : null;
}

/** A chunk left with nothing for the agent once a refused call's pieces are taken out. */
function emptied(chunk: Obj): boolean {
  if (chunk.usage !== undefined && chunk.usage !== null) return false;
  return (chunk.choices as unknown[]).every((c) => {
    if (c === null || typeof c !== 'object') return false;
    const { delta, finish_reason } = c as Obj;
    if (finish_reason !== null && finish_reason !== undefined) return false;
    if (delta === undefined || delta === null) return true;
    return Object.entries(delta as Obj).every(([k, v]) => v === null || (k === 'content' && v === ''));
  });
}
