import { MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { WireFormat } from '../../../pipeline/policy/snapshot.ts';
import { type Disclosure, denialMessage } from './denial.ts';
import { type SseFrame, SseFramer } from './sse-frames.ts';
import type { Decide, ToolCall, ToolVerdict } from './types.ts';

// The tool gate of a streamed answer (docs/tool-policy.md, "Streamed answers"), whatever its format:
//
//   upstream bytes ─▶ SseFramer ─▶ format.read ─┬─ no call pending ─▶ format.render ─▶ ready ─▶ next()
//                     (events)    (which calls)  └─ else ─▶ held, in order ──(decisions)──┘
//
// Events flow as they arrive until one belongs to a tool call: from there on every event is held, in
// order, until the calls it belongs to are decided. A call is decided as soon as it is whole (the
// format says when), concurrently with any other; the held events are released from the front as far
// as decisions allow: an allowed call's events byte for byte, a refused call's as the format's denial.
// While anything is held a keep-alive in the format's own terms goes out every `keepAliveMs` in which
// nothing else did. The gate does no I/O: the relay (relay-gated.ts) pushes upstream bytes and writes
// what next() hands out.

/** Where a call stands. `dropped`: never whole (the answer ended or overflowed first); it vanishes. */
export type CallState = 'open' | 'deciding' | 'allowed' | 'refused' | 'dropped';

export interface CallOutcome {
  state: CallState;
  /** The call as decided (null while open). */
  call: ToolCall | null;
  /** When refused: what the agent reads in its place. */
  message: string;
}

/** What a format tells the gate about the calls while it reads events. */
export interface CallTracker {
  /** A new call begins; returns its seq. */
  open(): number;
  /** Call `seq` is whole: it is decided now. */
  whole(seq: number, call: Omit<ToolCall, 'seq'>): void;
  /** Call `seq` is refused by the gate itself (`reason` goes into its message), without a decision. */
  refuse(seq: number, call: Omit<ToolCall, 'seq'>, reason: string): void;
  /** Every call so far, by seq. */
  readonly calls: readonly CallOutcome[];
}

/** One wire format's side of the gate: which events belong to calls, and how refused calls read. */
export interface StreamToolFormat {
  readonly format: WireFormat;
  /** What keeps the stream alive while events are held. */
  readonly keepAlive: Buffer;
  /** Reads the next event of the answer; returns the seqs of the calls it belongs to ([] for none). */
  read(frame: SseFrame, calls: CallTracker): readonly number[];
  /**
   * The bytes that go out for `frame` (which belongs to the calls `seqs`, all settled by now): `frame.raw`
   * when nothing changes. Called once per event, in order, so it may count what went out.
   */
  render(frame: SseFrame, seqs: readonly number[], calls: readonly CallOutcome[]): Buffer;
  /** The answer's id once an event has named it (Anthropic message, Responses response); chat has none. */
  readonly answerId?: string | null;
  /** Whether call `seq` is a free-text custom tool call (Responses `custom_tool_call`). */
  isCustom?(seq: number): boolean;
}

export interface StreamGateOptions {
  /** A keep-alive goes out after this long with nothing else going out while events are held. */
  keepAliveMs?: number;
  /**
   * The most the gate holds (held events and an event not yet ended). Past it the calls not yet decided
   * are refused, what was held is released, and the gate ends: `overflowed` tells the relay to cut the
   * answer there.
   */
  maxHeldBytes?: number;
  /** How the gate words a refusal of its own (overflow, an inconsistent answer): --inspection-disclosure. */
  disclosure?: Disclosure;
  /**
   * Told of each refused call as it is refused, before its denial can go out (with the answer's id):
   * a provider holding the conversation gets the refusal as an error tool result on the next turn
   * (steps/refused-results.ts).
   */
  onRefused?: (refused: { answerId: string | null; call: ToolCall; message: string; custom: boolean }) => void;
}

export const DEFAULT_KEEP_ALIVE_MS = 15_000;

export class StreamGate {
  readonly #format: StreamToolFormat;
  readonly #decide: Decide;
  readonly #keepAliveMs: number;
  readonly #maxHeld: number;
  readonly #refusal: (call: ToolCall, reason: string) => string;
  readonly #onRefused: StreamGateOptions['onRefused'];
  readonly #framer = new SseFramer();
  readonly #calls: CallOutcome[] = [];
  readonly #tracker: CallTracker;
  /** Events held, in order, with the calls each belongs to; the front is at #head. */
  #held: { frame: SseFrame; seqs: readonly number[] }[] = [];
  #head = 0;
  #heldBytes = 0;
  #ready: Buffer[] = [];
  #readyBytes = 0;
  #waiter: ((out: Buffer | null) => void) | null = null;
  #timer: NodeJS.Timeout | null = null;
  #ended = false;
  #cancelled = false;
  #overflowed = false;

  constructor(format: StreamToolFormat, decide: Decide, options: StreamGateOptions = {}) {
    this.#format = format;
    this.#decide = decide;
    this.#keepAliveMs = options.keepAliveMs ?? DEFAULT_KEEP_ALIVE_MS;
    this.#maxHeld = options.maxHeldBytes ?? MAX_BODY_BYTES;
    const disclosure = options.disclosure ?? 'detailed';
    this.#refusal = (call, reason) => denialMessage(call, reason, disclosure);
    this.#onRefused = options.onRefused;
    const calls = this.#calls;
    this.#tracker = {
      calls,
      open: () => calls.push({ state: 'open', call: null, message: '' }) - 1,
      whole: (seq, call) => this.#whole(seq, call),
      refuse: (seq, call, reason) => {
        const c = calls[seq];
        if (c.state !== 'open') return;
        c.call = { seq, ...call };
        c.state = 'refused';
        c.message = this.#refusal(c.call, reason);
        this.#reportRefused(c.call, reason);
        this.#refused(c);
      },
    };
  }

  /** The calls seen so far, by seq. */
  get calls(): readonly CallOutcome[] {
    return this.#calls;
  }

  /** The gate held more than `maxHeldBytes` and ended there: the answer must be cut. */
  get overflowed(): boolean {
    return this.#overflowed;
  }

  /** Bytes ready and not yet taken by next(). */
  get readyBytes(): number {
    return this.#readyBytes;
  }

  /** Upstream bytes (in the agent's format). */
  push(chunk: Buffer): void {
    if (this.#ended || this.#cancelled) return;
    for (const frame of this.#framer.push(chunk)) this.#take(frame);
    if (this.#heldBytes + this.#framer.pending > this.#maxHeld) this.#overflow();
    else this.#settle();
  }

  /** The upstream ended: a call not yet whole is dropped, the rest waits for its decision. */
  end(): void {
    if (this.#ended || this.#cancelled) return;
    for (const frame of this.#framer.end()) this.#take(frame);
    this.#ended = true;
    for (const c of this.#calls) if (c.state === 'open') c.state = 'dropped';
    this.#settle();
  }

  /**
   * The agent left: nothing more is held, released or decided, and next() answers null. Decisions still
   * under way are the Decide owner's to cancel; their verdicts are ignored.
   */
  cancel(): void {
    if (this.#cancelled) return;
    this.#cancelled = true;
    this.#held = [];
    this.#head = 0;
    this.#heldBytes = 0;
    this.#ready = [];
    this.#readyBytes = 0;
    this.#stopKeepAlive();
    this.#wake();
  }

  /** The next bytes for the agent, as soon as there are any; null once the answer is all out (or cancelled). */
  next(): Promise<Buffer | null> {
    if (this.#readyBytes > 0) return Promise.resolve(this.#takeReady());
    if (this.#finished()) return Promise.resolve(null);
    return new Promise((resolve) => {
      this.#waiter = resolve;
    });
  }

  #finished(): boolean {
    return this.#cancelled || (this.#ended && this.#head === this.#held.length);
  }

  #take(frame: SseFrame): void {
    const seqs = this.#format.read(frame, this.#tracker);
    if (this.#head < this.#held.length || seqs.some((s) => !this.#settled(s))) {
      this.#held.push({ frame, seqs });
      this.#heldBytes += frame.raw.length;
      return;
    }
    this.#out(this.#format.render(frame, seqs, this.#calls));
  }

  #settled(seq: number): boolean {
    const state = this.#calls[seq].state;
    return state !== 'open' && state !== 'deciding';
  }

  #whole(seq: number, call: Omit<ToolCall, 'seq'>): void {
    const c = this.#calls[seq];
    if (c.state !== 'open') return;
    c.state = 'deciding';
    c.call = { seq, ...call };
    const decided = c.call;
    let verdict: Promise<ToolVerdict>;
    try {
      verdict = Promise.resolve(this.#decide(decided));
    } catch {
      verdict = Promise.reject(new Error('decide threw'));
    }
    verdict.then(
      (v) => this.#decided(seq, v),
      () => this.#decided(seq, { allow: false, message: this.#refusal(decided, 'its decision failed') }),
    );
  }

  #decided(seq: number, verdict: ToolVerdict): void {
    const c = this.#calls[seq];
    if (this.#cancelled || c.state !== 'deciding') return;
    // Only an explicit allow allows; a refusal without a text still says what happened.
    const allow = verdict?.allow === true;
    c.state = allow ? 'allowed' : 'refused';
    c.message = allow
      ? ''
      : typeof verdict?.message === 'string' && verdict.message !== ''
        ? verdict.message
        : this.#refusal(c.call!, 'refused by policy');
    if (!allow) this.#refused(c);
    this.#settle();
  }

  /** Tells onRefused of a call just refused. */
  #refused(c: CallOutcome): void {
    if (this.#onRefused === undefined || c.call === null) return;
    const custom = this.#format.isCustom?.(c.call.seq) ?? false;
    this.#onRefused({ answerId: this.#format.answerId ?? null, call: c.call, message: c.message, custom });
  }

  /** Releases held events from the front as far as decisions allow; keeps the keep-alive to what is held. */
  #settle(): void {
    if (this.#cancelled) return;
    while (this.#head < this.#held.length) {
      const { frame, seqs } = this.#held[this.#head];
      if (!seqs.every((s) => this.#settled(s))) break;
      this.#held[this.#head++] = undefined as never;
      this.#heldBytes -= frame.raw.length;
      this.#out(this.#format.render(frame, seqs, this.#calls));
    }
    if (this.#head === this.#held.length) {
      this.#held = [];
      this.#head = 0;
      this.#stopKeepAlive();
    } else if (this.#timer === null && this.#keepAliveMs > 0) {
      this.#timer = setTimeout(() => this.#keepAlive(), this.#keepAliveMs);
    }
    this.#wake();
  }

  #overflow(): void {
    this.#overflowed = true;
    this.#ended = true;
    for (const c of this.#calls) {
      if (c.state === 'open') c.state = 'dropped';
      else if (c.state === 'deciding') {
        const reason = `the answer held for its decision exceeded ${this.#maxHeld} bytes`;
        c.state = 'refused';
        c.message = this.#refusal(c.call!, reason);
        this.#reportRefused(c.call!, reason);
        this.#refused(c);
      }
    }
    this.#settle();
  }

  /** A refusal of the gate's own goes to the Decide's owner, to be recorded like a decision. */
  #reportRefused(call: ToolCall, reason: string): void {
    try {
      this.#decide.refused?.(call, reason);
    } catch {
      // Recording is the owner's; a failure there changes nothing here: the call stays refused.
    }
  }

  #keepAlive(): void {
    this.#timer = null;
    if (this.#cancelled || this.#head === this.#held.length) return;
    this.#out(this.#format.keepAlive);
    this.#timer = setTimeout(() => this.#keepAlive(), this.#keepAliveMs);
    this.#wake();
  }

  #stopKeepAlive(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #out(bytes: Buffer): void {
    if (bytes.length === 0) return;
    this.#ready.push(bytes);
    this.#readyBytes += bytes.length;
    // Something went out: the next keep-alive is due a whole period from now.
    this.#timer?.refresh();
  }

  #takeReady(): Buffer {
    const out = this.#ready.length === 1 ? this.#ready[0] : Buffer.concat(this.#ready, this.#readyBytes);
    this.#ready = [];
    this.#readyBytes = 0;
    return out;
  }

  #wake(): void {
    const waiter = this.#waiter;
    if (waiter === null) return;
    if (this.#readyBytes > 0) {
      this.#waiter = null;
      waiter(this.#takeReady());
    } else if (this.#finished()) {
      this.#waiter = null;
      waiter(null);
    }
  }
}
