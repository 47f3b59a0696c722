import { mkdir, open, readdir, readFile, stat, unlink, writeFile, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../core/logger.ts';
import { silentLogger } from '../core/logger.ts';
import { readCheckpoint, syncDir, writeCheckpoint, type Position } from './checkpoint.ts';
import { WalClosedError, WalFullError, WalWriteError } from './errors.ts';
import {
  checkHeader,
  decodeFrames,
  encodeJsonFrames,
  FRAME_OVERHEAD,
  HEADER_BYTES,
  MAX_RECORD_BYTES,
  segmentHeader,
} from './frame.ts';

// One audit table's write-ahead log: a directory of numbered segment files.
//
//   append(record) ──▶ pending batch ──▶ encoded once, one write + fdatasync (group commit) ──▶ resolved: durable
//                                      │ past --audit-wal-max-bytes unshipped: dropped and counted
//   shipper: read(checkpoint) ──▶ store ──▶ commit(next) ──▶ segments wholly before it are deleted
//
// On open the last segment's tail is scanned and cut at the first torn or corrupt frame (logged with
// its byte offset): everything before it was durable and stays. A failed write is cut back off the
// file, so one bad batch never leaves a torn frame in front of later ones.
//
// A batch is the unit of work end to end: an append adds its JSON text to the pending batch and gets
// that batch's one promise; the flush encodes the whole batch into one Buffer, writes it, fdatasyncs,
// and settles every appender of it with one resolve. Per record there is only the JSON text and its
// byte length (needed at append time for the ceiling), no frame buffer, promise or closure of its own.

export const DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024;
export const DEFAULT_MAX_UNSHIPPED_BYTES = 1024 * 1024 * 1024;

export interface WalMetrics {
  appended(table: string): void;
  durable(table: string, seconds: number): void;
  dropped(table: string): void;
  segments(table: string, count: number): void;
  unshipped(table: string, bytes: number): void;
}

const NO_METRICS: WalMetrics = { appended() {}, durable() {}, dropped() {}, segments() {}, unshipped() {} };

export interface WalTableOptions {
  segmentBytes?: number;
  /** Ceiling of unshipped bytes; 0 or absent selects DEFAULT_MAX_UNSHIPPED_BYTES. */
  maxBytes?: number;
  log?: Logger;
  metrics?: WalMetrics;
}

/** Appends waiting for the next group commit; every one of them is settled by `done`. */
interface Batch {
  jsons: string[];
  /** UTF-8 byte length of each JSON text. */
  lengths: number[];
  /** performance.now() at each append, for the append-to-durable histogram. */
  started: number[];
  /** Encoded size: payloads plus FRAME_OVERHEAD each. */
  bytes: number;
  done: Promise<void>;
  resolve: () => void;
  reject: (err: Error) => void;
}

function newBatch(): Batch {
  const { promise, resolve, reject } = Promise.withResolvers<void>();
  return { jsons: [], lengths: [], started: [], bytes: 0, done: promise, resolve, reject };
}

export interface WalRecord {
  position: Position;
  payload: Buffer;
}

const segmentName = (id: number) => `${String(id).padStart(12, '0')}.wal`;

/** Records dropped at the ceiling, over the table's life (read by `dvx wal stat`). */
export const DROPPED_FILE = 'dropped.json';

export async function readDropped(dir: string): Promise<number> {
  try {
    const n = (JSON.parse(await readFile(join(dir, DROPPED_FILE), 'utf8')) as { dropped?: unknown }).dropped;
    return typeof n === 'number' && n >= 0 ? n : 0;
  } catch {
    // Never written (nothing dropped yet) or unreadable: the count is informational (`dvx wal stat`).
    return 0;
  }
}

export class WalTable {
  readonly name: string;
  readonly dir: string;
  #segmentBytes: number;
  #maxBytes: number;
  #log: Logger;
  #metrics: WalMetrics;
  #segments: number[] = [];
  #sizes = new Map<number, number>();
  #handle: FileHandle | null = null;
  #pending: Batch | null = null;
  /** Bytes of the batch being written: neither pending nor yet durable. */
  #writingBytes = 0;
  #flushing: Promise<void> | null = null;
  #checkpoint: Position = { segment: 1, offset: HEADER_BYTES };
  #unshipped = 0;
  #dropped = 0;
  #lastDropLog = 0;
  #dropSave: NodeJS.Timeout | null = null;
  #broken: Error | null = null;
  #closed = false;
  #waiters: (() => void)[] = [];

  private constructor(dir: string, name: string, options: WalTableOptions) {
    this.dir = dir;
    this.name = name;
    this.#segmentBytes = options.segmentBytes ?? DEFAULT_SEGMENT_BYTES;
    this.#maxBytes = options.maxBytes || DEFAULT_MAX_UNSHIPPED_BYTES;
    this.#log = options.log ?? silentLogger();
    this.#metrics = options.metrics ?? NO_METRICS;
  }

  static async open(dir: string, name: string, options: WalTableOptions = {}): Promise<WalTable> {
    const table = new WalTable(dir, name, options);
    await table.#recover();
    return table;
  }

  async #recover(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    this.#segments = (await readdir(this.dir))
      .filter((f) => /^\d{12}\.wal$/.test(f))
      .map((f) => Number(f.slice(0, 12)))
      .sort((a, b) => a - b);
    for (const id of this.#segments) this.#sizes.set(id, (await stat(join(this.dir, segmentName(id)))).size);
    if (this.#segments.length === 0) await this.#createSegment(1);
    else await this.#repairTail();
    const last = this.#segments.at(-1)!;
    this.#handle = await open(join(this.dir, segmentName(last)), 'a');
    this.#dropped = await readDropped(this.dir);
    const saved = await readCheckpoint(this.dir);
    const first = this.#segments[0];
    this.#checkpoint = saved && saved.segment >= first ? saved : { segment: first, offset: HEADER_BYTES };
    if (
      this.#checkpoint.segment > last ||
      (this.#checkpoint.segment === last && this.#checkpoint.offset > this.#sizes.get(last)!)
    ) {
      this.#log.warn(
        { table: this.name, checkpoint: this.#checkpoint },
        'wal checkpoint past the end of the log; restarting from the end',
      );
      this.#checkpoint = { segment: last, offset: this.#sizes.get(last)! };
    }
    this.#recountUnshipped();
  }

  /** Cuts the last segment at its first torn or corrupt frame. */
  async #repairTail(): Promise<void> {
    const last = this.#segments.at(-1)!;
    const path = join(this.dir, segmentName(last));
    const handle = await open(path, 'r+');
    try {
      const size = this.#sizes.get(last)!;
      const buf = Buffer.allocUnsafe(size);
      await handle.read(buf, 0, size, 0);
      const bad = checkHeader(buf);
      if (bad !== null) {
        // A segment created but never given its header (a crash between create and write).
        this.#log.warn({ table: this.name, segment: last, problem: bad }, 'wal segment header rewritten');
        await handle.truncate(0);
        await handle.write(segmentHeader(), 0, HEADER_BYTES, 0);
        await handle.datasync();
        this.#sizes.set(last, HEADER_BYTES);
        return;
      }
      const { validEnd, problem } = decodeFrames(buf, HEADER_BYTES);
      if (problem !== null) {
        this.#log.warn(
          { table: this.name, segment: last, offset: validEnd, dropped_bytes: size - validEnd, problem },
          'wal tail cut at the first torn or corrupt frame',
        );
        await handle.truncate(validEnd);
        await handle.datasync();
        this.#sizes.set(last, validEnd);
      }
    } finally {
      await handle.close();
    }
  }

  async #createSegment(id: number): Promise<void> {
    const path = join(this.dir, segmentName(id));
    const handle = await open(path, 'wx');
    try {
      await handle.write(segmentHeader(), 0, HEADER_BYTES, 0);
      await handle.datasync();
    } finally {
      await handle.close();
    }
    await syncDir(this.dir);
    this.#segments.push(id);
    this.#sizes.set(id, HEADER_BYTES);
    this.#metrics.segments(this.name, this.#segments.length);
  }

  #recountUnshipped(): void {
    let bytes = 0;
    for (const id of this.#segments) {
      if (id < this.#checkpoint.segment) continue;
      const size = this.#sizes.get(id)!;
      bytes += id === this.#checkpoint.segment ? size - this.#checkpoint.offset : size - HEADER_BYTES;
    }
    this.#unshipped = Math.max(0, bytes);
    this.#metrics.unshipped(this.name, this.#unshipped);
  }

  /**
   * Appends one record; resolves once it is durable (written and fdatasync'ed). Rejects with
   * WalFullError past the ceiling (counted, never blocking), WalWriteError when the disk fails.
   */
  append(record: unknown): Promise<void> {
    if (this.#closed) return Promise.reject(new WalClosedError(`wal ${this.name} is closed`));
    if (this.#broken) return Promise.reject(new WalWriteError(`wal ${this.name} is unusable: ${this.#broken.message}`));
    const json = JSON.stringify(record);
    const length = Buffer.byteLength(json);
    if (length > MAX_RECORD_BYTES)
      return Promise.reject(new WalWriteError(`audit record of ${length} bytes exceeds ${MAX_RECORD_BYTES}`));
    const frameBytes = FRAME_OVERHEAD + length;
    if (this.#unshipped + this.#writingBytes + (this.#pending?.bytes ?? 0) + frameBytes > this.#maxBytes) {
      this.#dropped++;
      this.#metrics.dropped(this.name);
      // The count outlives the process for `dvx wal stat`; written at most once a second.
      this.#dropSave ??= setTimeout(() => {
        this.#dropSave = null;
        writeFile(join(this.dir, DROPPED_FILE), JSON.stringify({ dropped: this.#dropped })).catch((err: unknown) => {
          this.#log.warn({ err, table: this.name }, 'dropped-record count not saved; `dvx wal stat` will show less');
        });
      }, 1000);
      const now = Date.now();
      if (now - this.#lastDropLog > 10_000) {
        this.#lastDropLog = now;
        this.#log.error(
          { table: this.name, dropped_total: this.#dropped, max_bytes: this.#maxBytes },
          'wal full: audit records dropped',
        );
      }
      return Promise.reject(
        new WalFullError(`wal ${this.name} holds ${this.#maxBytes} unshipped bytes; record dropped`),
      );
    }
    this.#metrics.appended(this.name);
    const batch = (this.#pending ??= newBatch());
    batch.jsons.push(json);
    batch.lengths.push(length);
    batch.started.push(performance.now());
    batch.bytes += frameBytes;
    this.#flushing ??= this.#flushLoop();
    return batch.done;
  }

  async #flushLoop(): Promise<void> {
    try {
      // Start the first write on the loop's check phase, not inside the append that found the log idle:
      // every append made by the callbacks of this loop turn (the appenders a batch just released, the
      // requests that finished together) joins one batch instead of the first going out alone and the
      // rest waiting a whole fdatasync behind it. While a write is in flight, the next batch fills as before.
      await new Promise<void>((resolve) => setImmediate(resolve));
      while (this.#pending !== null) {
        const batch = this.#pending;
        this.#pending = null;
        this.#writingBytes = batch.bytes;
        try {
          await this.#write(encodeJsonFrames(batch.jsons, batch.lengths, batch.bytes));
        } catch (err) {
          this.#writingBytes = 0;
          const failure = new WalWriteError(`wal ${this.name} write failed: ${(err as Error).message}`, { cause: err });
          this.#log.error({ err, table: this.name, records: batch.jsons.length }, 'wal write failed');
          batch.reject(failure);
          continue;
        }
        batch.resolve();
        const now = performance.now();
        for (const started of batch.started) this.#metrics.durable(this.name, (now - started) / 1000);
        this.#notify();
      }
    } finally {
      this.#flushing = null;
    }
  }

  /** Appends one encoded batch and fdatasyncs it; on failure the file is cut back to where it was. */
  async #write(frames: Buffer): Promise<void> {
    const bytes = frames.length;
    let last = this.#segments.at(-1)!;
    if (this.#sizes.get(last)! > HEADER_BYTES && this.#sizes.get(last)! + bytes > this.#segmentBytes) {
      await this.#handle!.close();
      this.#handle = null;
      await this.#createSegment(last + 1);
      last += 1;
      this.#handle = await open(join(this.dir, segmentName(last)), 'a');
    }
    const before = this.#sizes.get(last)!;
    try {
      // A write may take less than asked; finish the rest.
      for (let written = 0; written < bytes; )
        written += (await this.#handle!.write(frames, written, bytes - written, null)).bytesWritten;
      await this.#handle!.datasync();
    } catch (err) {
      // Cut whatever part of the batch reached the file, so later frames are not hidden behind it.
      try {
        await this.#handle!.truncate(before);
        await this.#handle!.datasync();
      } catch (cutErr) {
        this.#broken = cutErr as Error;
      }
      throw err;
    }
    this.#sizes.set(last, before + bytes);
    this.#writingBytes = 0;
    this.#unshipped += bytes;
    this.#metrics.unshipped(this.name, this.#unshipped);
  }

  #notify(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }

  /** Resolves when new records become durable (or after `ms`). */
  changed(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.#waiters.push(done);
    });
  }

  get checkpoint(): Position {
    return { ...this.#checkpoint };
  }

  /** The position just past the last durable record. */
  get end(): Position {
    const last = this.#segments.at(-1)!;
    return { segment: last, offset: this.#sizes.get(last)! };
  }

  /** Whether everything before `position` is shipped (the checkpoint reached it). */
  shippedTo(position: Position): boolean {
    const c = this.#checkpoint;
    return c.segment > position.segment || (c.segment === position.segment && c.offset >= position.offset);
  }

  /** Durable records from `from`, up to `maxRecords` / about `maxBytes`, and the position after them. */
  async read(
    from: Position,
    maxRecords: number,
    maxBytes = 8 * 1024 * 1024,
  ): Promise<{ records: WalRecord[]; next: Position }> {
    const records: WalRecord[] = [];
    let pos = { ...from };
    let budget = maxBytes;
    while (records.length < maxRecords && budget > 0) {
      const size = this.#sizes.get(pos.segment);
      if (size === undefined) {
        const later = this.#segments.find((id) => id > pos.segment);
        if (later === undefined) break;
        pos = { segment: later, offset: HEADER_BYTES };
        continue;
      }
      if (pos.offset >= size) {
        const later = this.#segments.find((id) => id > pos.segment);
        if (later === undefined) break;
        pos = { segment: later, offset: HEADER_BYTES };
        continue;
      }
      const want = Math.min(size - pos.offset, Math.max(budget, FRAME_OVERHEAD));
      const handle = await open(join(this.dir, segmentName(pos.segment)), 'r');
      let buf: Buffer;
      try {
        // Read at least one whole frame, however large.
        const head = Buffer.allocUnsafe(FRAME_OVERHEAD);
        await handle.read(head, 0, FRAME_OVERHEAD, pos.offset);
        const first = FRAME_OVERHEAD + head.readUInt32LE(0);
        const length = Math.min(size - pos.offset, Math.max(want, first));
        buf = Buffer.allocUnsafe(length);
        await handle.read(buf, 0, length, pos.offset);
      } finally {
        await handle.close();
      }
      const { frames, validEnd, problem } = decodeFrames(buf, 0, maxRecords - records.length);
      for (const f of frames)
        records.push({ position: { segment: pos.segment, offset: pos.offset + f.offset }, payload: f.payload });
      const consumed = validEnd;
      budget -= consumed;
      if (problem !== null && pos.offset + buf.length === size) {
        // Corruption inside durable data (not a read window boundary): skip the rest of this segment.
        this.#log.error(
          { table: this.name, segment: pos.segment, offset: pos.offset + validEnd, problem },
          'wal corruption; rest of segment skipped',
        );
        pos = { segment: pos.segment, offset: size };
        continue;
      }
      pos = { segment: pos.segment, offset: pos.offset + consumed };
      if (frames.length === 0) break;
    }
    return { records, next: pos };
  }

  /** Records that everything before `next` is shipped; deletes segments wholly before it. */
  async commit(next: Position): Promise<void> {
    await writeCheckpoint(this.dir, next);
    this.#checkpoint = { ...next };
    const last = this.#segments.at(-1)!;
    for (const id of [...this.#segments]) {
      if (id >= next.segment || id === last) break;
      await unlink(join(this.dir, segmentName(id)));
      this.#segments.shift();
      this.#sizes.delete(id);
    }
    this.#metrics.segments(this.name, this.#segments.length);
    this.#recountUnshipped();
  }

  stats(): { segments: number; unshippedBytes: number; dropped: number; checkpoint: Position } {
    return {
      segments: this.#segments.length,
      unshippedBytes: this.#unshipped,
      dropped: this.#dropped,
      checkpoint: this.checkpoint,
    };
  }

  /** Waits for appends in flight, then closes. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#dropSave) {
      clearTimeout(this.#dropSave);
      this.#dropSave = null;
      await writeFile(join(this.dir, DROPPED_FILE), JSON.stringify({ dropped: this.#dropped })).catch(
        (err: unknown) => {
          this.#log.warn({ err, table: this.name }, 'dropped-record count not saved; `dvx wal stat` will show less');
        },
      );
    }
    await this.#flushing;
    this.#notify();
    await this.#handle?.close();
    this.#handle = null;
  }
}
