import {
  isEdge,
  mergeResults,
  reachEnd,
  MIN_REACH,
  secretsReach,
  splitPatterns,
  type ByteRange,
} from './byte-ranges.ts';
import { carriesJsonEscapes } from './json-view.ts';
import { SSE_TEXT } from './inspection-input.ts';
import { runFor, type ScanPlan } from './plan.ts';
import type { ResolvedPolicy } from './policy/types.ts';
import { hasBuiltinWork, type ScanResult } from './scan.ts';
import { blockView, SseJoiner, type JoinedBlock } from './sse-text.ts';
import type { StretchKind, StretchTask } from './stream-scan.ts';

// A streamed response inspected as it arrives (docs/decisions.md, "A streamed answer inspected as it
// arrives"). The whole-body scan at the end read the stream as sent and its joined delta text; here
// both are scanned in stretches while the stream passes, so at its end only the last stretch is left:
//
//   chunks ─▶ copy (≤ 32 MB) ─┬─ every ≥ CHECKPOINT_BYTES: bytes [start, reach(edge)) ─┐ one scan in
//                             │    cut after a newline, overlap as byte-ranges.ts says   ├─ flight, off
//                             └─ SseJoiner: blocks whose stop event arrived, joined ────┘ the relay
//   end ─▶ bytes [last edge, end) + blocks not scanned (or grown since) ─▶ merged with the above
//
// Exactly the whole scan's findings: the byte ranges are byte-ranges.ts's (a policy it cannot split
// scans the body whole at the end); a block is scanned with the newline that precedes it in the
// joined text, so a match that cannot hold a newline (every built-in; a custom pattern patternReach
// calls separator-free; a secret without one) is found in it exactly as in the joined text; any other
// pattern or secret, and the joined text is scanned whole at the end. A block that grows after its
// scan is scanned again, whole, at the end and its first result dropped. A long text block is not left
// for its stop: every CHECKPOINT_BYTES of its text are scanned up to their last newline (with the
// newline before them), for the same reason a block may be; the block's stop then scans what is left.

/** Unscanned bytes that make a checkpoint. */
export const CHECKPOINT_BYTES = 64 * 1024;

/** Runs one stretch (inline or on the pool) and says what it found; never throws. */
export type StretchScanner = (task: Omit<StretchTask, 'policy' | 'secrets'>, last: boolean) => Promise<ScanResult>;

export class StreamInspection {
  readonly #scan: StretchScanner;
  readonly #checkpoint: number;
  readonly #onCheckpoint: (kind: StretchKind) => void;
  readonly #work: boolean;
  readonly #joinedRead: boolean;
  /** The byte-range reach (byte-ranges.ts), or null: the body is scanned whole at the end. */
  readonly #reach: number | null;
  /** Blocks can be scanned as they finish (no pattern or secret can span two). */
  readonly #perBlock: boolean;
  readonly #joiner: SseJoiner;
  #gaveUp = false;
  #buf: Buffer = Buffer.alloc(0);
  #len = 0;
  /** Where the next byte range starts (the last edge cut at). */
  #start = 0;
  /** Bytes received when a cut was last looked for and none found. */
  #triedAt = 0;
  readonly #ranges: ScanResult[] = [];
  readonly #blockResults = new Map<JoinedBlock, { pieces: number; result: Promise<ScanResult> }>();
  /** Text blocks still open whose text is being scanned in lines (see #lines). */
  readonly #lined = new Map<JoinedBlock, LinedBlock>();
  /** Open blocks that received text since a line cut was last looked for. */
  readonly #growing = new Set<JoinedBlock>();
  #inFlight: Promise<unknown> | null = null;
  #ended = false;

  constructor(
    plan: ScanPlan,
    policy: ResolvedPolicy,
    secrets: readonly string[],
    scan: StretchScanner,
    onCheckpoint: (kind: StretchKind) => void,
    checkpointBytes = CHECKPOINT_BYTES,
  ) {
    this.#checkpoint = checkpointBytes;
    this.#scan = scan;
    this.#onCheckpoint = onCheckpoint;
    this.#work = hasBuiltinWork(plan, 'response', secrets.length);
    this.#joinedRead = this.#work && runFor(plan, 'response', secrets.length, 'all', false, false).joined;
    const split = splitPatterns(policy.content?.patterns ?? []);
    const secretReach = secretsReach(secrets);
    this.#reach = split.whole.length === 0 && secretReach !== null ? Math.max(split.reach, secretReach) : null;
    this.#perBlock =
      (policy.content?.patterns ?? []).every((p) => cannotMatchNewline(p.pattern)) &&
      !secrets.some((s) => s.includes('\n'));
    this.#joiner = new SseJoiner(() => {
      this.#gaveUp = true;
    });
  }

  /** The stream's bytes kept so far (the response pipeline's copy). */
  get body(): Buffer {
    return this.#buf.subarray(0, this.#len);
  }

  /** A chunk of the stream, as kept in the copy. A scan due is started after this call returns. */
  push(chunk: Buffer): void {
    if (this.#ended) return;
    if (this.#len + chunk.length > this.#buf.length) {
      const grown = Buffer.allocUnsafe(Math.max(this.#len + chunk.length, 2 * this.#buf.length, 64 * 1024));
      this.#buf.copy(grown, 0, 0, this.#len);
      this.#buf = grown;
    }
    chunk.copy(this.#buf, this.#len);
    this.#len += chunk.length;
    if (!this.#work) return;
    this.#joiner.push(chunk);
    if (this.#inFlight === null) this.#next();
  }

  /** Starts the next stretch's scan when one is due; one at a time, each after the current one. */
  #next(): void {
    const due = this.#due();
    if (due === null) return;
    this.#onCheckpoint(due.kind);
    this.#inFlight = due.done.then(() => {
      this.#inFlight = null;
      if (!this.#ended) this.#next();
    });
  }

  /** The stretch due now, its bytes taken; its scan starts after the relay's own work for this chunk. */
  #due(): { kind: StretchKind; done: Promise<unknown> } | null {
    const blocks = this.#perBlock && this.#joiner.pieces >= 2 ? this.#finished() : [];
    if (blocks.length > 0) {
      const text = this.#blockText(blocks, () => false);
      const result = later(() => this.#scan({ kind: 'joined', body: text }, false));
      for (const b of blocks) this.#blockResults.set(b, { pieces: b.texts.length, result });
      return { kind: 'joined', done: result };
    }
    const lines = this.#perBlock && this.#joiner.pieces >= 2 ? this.#lineCut() : null;
    if (lines !== null) {
      const result = later(() => this.#scan({ kind: 'joined', body: lines.text }, false));
      lines.block.results.push(result);
      return { kind: 'joined', done: result };
    }
    const range = this.#cut();
    if (range === null) return null;
    const body = this.#shared(range);
    const context = { jsonEscapes: carriesJsonEscapes(this.body) };
    const index = this.#ranges.push(RESULT_PENDING) - 1;
    const done = later(() => this.#scan({ kind: 'bytes', body, context }, false)).then((r) => {
      this.#ranges[index] = r;
    });
    return { kind: 'bytes', done };
  }

  /** Blocks stopped and not scanned yet (the joiner hands each over once, when it stops). */
  #finished(): JoinedBlock[] {
    const out: JoinedBlock[] = [];
    for (const b of this.#joiner.takeStopped()) {
      this.#growing.delete(b);
      if (!this.#blockResults.has(b)) out.push(b);
    }
    return out;
  }

  /**
   * The next lines of a long open text block, when CHECKPOINT_BYTES of its text arrived since its last
   * cut: its text up to the last newline, after the newline that precedes it (the block's own in the
   * joined text, or the one its previous cut ended with), so every line is read with the context it has
   * in the joined text. A JSON block (decoded only once joined) is never cut.
   */
  #lineCut(): { block: LinedBlock; text: Buffer } | null {
    for (const b of this.#joiner.takeGrown()) if (!b.stopped) this.#growing.add(b);
    for (const b of this.#growing) {
      let lined = this.#lined.get(b);
      if (b.json) {
        this.#growing.delete(b);
        continue;
      }
      if (lined === undefined)
        this.#lined.set(b, (lined = { consumed: 0, tail: '', lastNewline: -1, cuts: 0, results: [] }));
      for (; lined.consumed < b.texts.length; lined.consumed++) {
        const text = b.texts[lined.consumed];
        const nl = text.lastIndexOf('\n');
        if (nl >= 0) lined.lastNewline = lined.tail.length + nl;
        lined.tail += text;
      }
      this.#growing.delete(b);
      if (lined.lastNewline + 1 < this.#checkpoint) continue;
      const lead = lined.cuts > 0 || b !== this.#joiner.first ? '\n' : '';
      const text = Buffer.from(lead + lined.tail.slice(0, lined.lastNewline + 1), 'utf8');
      lined.tail = lined.tail.slice(lined.lastNewline + 1);
      lined.lastNewline = -1;
      lined.cuts++;
      return { block: lined, text };
    }
    return null;
  }

  /**
   * Blocks as the joined text holds them: each but the first after its newline. A text block cut in
   * lines gives only what its cuts left (after their last newline), unless `whole` says it is read whole.
   */
  #blockText(blocks: JoinedBlock[], whole: (b: JoinedBlock) => boolean): Buffer {
    const first = this.#joiner.first;
    const parts: Buffer[] = [];
    const ordered = blocks.includes(first!) ? [first!, ...blocks.filter((b) => b !== first)] : blocks;
    for (const b of ordered) {
      const lined = b.json || whole(b) ? undefined : this.#lined.get(b);
      if (lined === undefined || lined.cuts === 0) {
        if (b !== first) parts.push(NEWLINE);
        parts.push(blockView(b));
        continue;
      }
      parts.push(NEWLINE, Buffer.from(lined.tail + b.texts.slice(lined.consumed).join(''), 'utf8'));
    }
    return Buffer.concat(parts);
  }

  /** The results of a block's line cuts that still count (a block scanned again whole drops them). */
  #lineResults(whole: ReadonlySet<JoinedBlock> | undefined): Promise<ScanResult>[] {
    const out: Promise<ScanResult>[] = [];
    for (const [b, lined] of this.#lined) if (!b.json && !whole?.has(b)) out.push(...lined.results);
    return out;
  }

  /** The next byte range to scan, when CHECKPOINT_BYTES are unscanned and a cut with its overlap arrived. */
  #cut(): ByteRange | null {
    if (this.#reach === null) return null;
    const n = this.#len;
    if (n - this.#start < this.#checkpoint || n - this.#triedAt < this.#checkpoint / 4) return null;
    const body = this.body;
    const credits = 2 * Math.max(this.#reach, MIN_REACH);
    // The last newline that leaves room for the overlap before the bytes received end.
    if (n - 2 * credits <= this.#start) return null;
    let nl = body.lastIndexOf(0x0a, n - 2 * credits);
    for (; nl >= this.#start; nl = nl > 0 ? body.lastIndexOf(0x0a, nl - 1) : -1) {
      const edge = nl + 1;
      if (edge - this.#start < this.#checkpoint / 2) break;
      if (!isEdge(body, edge)) continue;
      const end = reachEnd(body, edge, credits);
      if (end < 0 || end >= n) break;
      const range = { start: this.#start, end };
      this.#start = edge;
      return range;
    }
    this.#triedAt = n;
    return null;
  }

  /** The range's bytes, in memory a worker shares. */
  #shared(range: ByteRange): Uint8Array {
    const shared = new Uint8Array(new SharedArrayBuffer(range.end - range.start));
    shared.set(this.#buf.subarray(range.start, range.end));
    return shared;
  }

  /**
   * The stream ended (or was cut): what is left is scanned, and every stretch's result merged, as the
   * whole-body scan's: findings once each, failures once each (a stretch that failed is a fail-open).
   */
  async finish(): Promise<ScanResult> {
    this.#ended = true;
    if (!this.#work) return { findings: [], failures: [] };
    this.#joiner.end();
    while (this.#inFlight !== null) await this.#inFlight;
    const body = this.body;
    const last: Promise<ScanResult>[] = [];
    const context = { jsonEscapes: carriesJsonEscapes(body) };
    if (this.#start < body.length || this.#ranges.length === 0) {
      const range = { start: this.#start, end: body.length };
      last.push(this.#scan({ kind: 'bytes', body: this.#shared(range), context }, true));
    }
    const joined = this.#joiner.pieces >= 2 ? this.#joinedLeft() : null;
    if (joined !== null) last.push(this.#scan({ kind: 'joined', body: joined.text }, true));
    const tail = await Promise.all(last);
    const results: ScanResult[] = [...this.#ranges, ...tail];
    if (this.#joiner.pieces >= 2) {
      const kept = new Set<Promise<ScanResult>>();
      for (const [block, { result }] of this.#blockResults) if (!joined?.rescanned.has(block)) kept.add(result);
      for (const result of this.#lineResults(joined?.whole)) kept.add(result);
      for (const result of kept) results.push(await result);
    }
    if (this.#gaveUp && this.#joinedRead)
      results.push({ findings: [], failures: [{ inspector: SSE_TEXT, reason: 'unparsable_lines' }] });
    return mergeResults(results);
  }

  /**
   * The joined text still to scan: all of it (not per block), or the blocks not scanned or grown since.
   * `rescanned`: blocks whose result at their stop no longer counts; `whole`: blocks read whole again,
   * whose line cuts no longer count either.
   */
  #joinedLeft(): { text: Buffer; rescanned: Set<JoinedBlock>; whole: Set<JoinedBlock> } | null {
    if (!this.#perBlock) {
      const text = this.#joiner.joined();
      const all = new Set(this.#blockResults.keys());
      return text ? { text, rescanned: all, whole: all } : null;
    }
    // A block that grew after its scan is scanned again, whole, with the blocks it was scanned with
    // (their one result is dropped: it read the block's first text only). A block that never stopped
    // is scanned from where its line cuts left it.
    const dropped = new Set<Promise<ScanResult>>();
    for (const b of this.#joiner.blocks()) {
      const scanned = this.#blockResults.get(b);
      if (scanned !== undefined && scanned.pieces !== b.texts.length) dropped.add(scanned.result);
    }
    const left: JoinedBlock[] = [];
    const whole = new Set<JoinedBlock>();
    for (const b of this.#joiner.blocks()) {
      const scanned = this.#blockResults.get(b);
      if (scanned === undefined) left.push(b);
      else if (dropped.has(scanned.result)) {
        left.push(b);
        whole.add(b);
      }
    }
    return left.length > 0
      ? { text: this.#blockText(left, (b) => whole.has(b)), rescanned: new Set(left), whole }
      : null;
  }
}

const NEWLINE = Buffer.from('\n');

/** A text block scanned in lines while it is open (StreamInspection.#lineCut). */
interface LinedBlock {
  /** Its texts read into `tail` so far. */
  consumed: number;
  /** Its text after the last cut. */
  tail: string;
  /** The last newline in `tail`, or -1. */
  lastNewline: number;
  cuts: number;
  results: Promise<ScanResult>[];
}

/**
 * Whether no match of this RE2 pattern can hold a newline nor read where the text ends (then it finds
 * in a block, scanned after its newline, exactly what it finds there in the joined text). Conservative:
 * any escape that may name a newline (`\n`, `\s`, `\S`, `\D`, `\W`, `\p`, `\x`, `\C`, an octal), a negated
 * class, a class range over U+000A or with an escaped bound, a named class (`[:space:]`), flags
 * (`(?s)` lets `.` match one; `(?m)` moves `^` and `$`), and every anchor (`^`, `$`, `\A`, `\z`, `\B`)
 * answer no.
 */
export function cannotMatchNewline(source: string): boolean {
  let inClass = false;
  for (let i = 0; i < source.length; i++) {
    const c = source[i];
    if (c === '\n') return false;
    if (c === '\\') {
      const next = source[++i] ?? '';
      if (/[0-9A-Za-z]/.test(next) && !'bdwtrfv'.includes(next)) return false;
      if (inClass && next === 'b') return false;
      // An escaped end of a range (`[\t-~]` runs from TAB over U+000A): the range's bounds are not read.
      if (inClass && source[i + 1] === '-' && source[i + 2] !== ']') return false;
      continue;
    }
    if (inClass) {
      // A named class (`[[:space:]]`, `[[:cntrl:]]`, `[[:^alpha:]]`): several hold a newline.
      if (c === '[' && source[i + 1] === ':') return false;
      if (c === ']') inClass = false;
      else if (c === '-' && source[i + 1] !== ']' && source[i - 1] !== '[') {
        const lo = source.charCodeAt(i - 1);
        const hi = source[i + 1] === '\\' ? -1 : source.charCodeAt(i + 1);
        if (hi < 0 || (lo <= 0x0a && hi >= 0x0a)) return false;
      }
      continue;
    }
    if (c === '[') {
      if (source[i + 1] === '^') return false;
      inClass = true;
      if (source[i + 1] === ']') i++;
      continue;
    }
    if (c === '^' || c === '$') return false;
    if (c === '(' && source[i + 1] === '?') {
      // A group's name or `:` are fine; flags are not.
      const rest = source.slice(i + 2);
      if (!(rest.startsWith(':') || rest.startsWith('P<') || rest.startsWith('<'))) return false;
    }
  }
  return !inClass;
}

/** Runs `scan` once the current turn of the event loop is done (the relay's write went first). */
function later(scan: () => Promise<ScanResult>): Promise<ScanResult> {
  return new Promise<void>((resolve) => setImmediate(resolve)).then(scan);
}
const RESULT_PENDING: ScanResult = { findings: [], failures: [] };
