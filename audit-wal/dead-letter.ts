import { access, open, readFile, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../core/logger.ts';
import { silentLogger } from '../core/logger.ts';
import { insertBisecting } from './bisect.ts';
import type { Position } from './checkpoint.ts';
import { DeadLetterBusyError } from './errors.ts';
import type { AuditTable } from './sink.ts';
import type { AuditWriter } from './store.ts';
import { WalTable } from './wal-table.ts';

// A table's dead-letter spool: the records its store will not take (or that cannot be read as a
// record at all), moved aside so the rest of the table ships. It is a WalTable of its own under
// <wal-dir>/<table>/dead-letter/ (same frames, same fsync before the shipper's checkpoint moves past
// the record), holding one entry per record: the record, why, and the store's error.
//
//   shipper ──add──▶ dead-letter/NNNNNNNNNNNN.wal ◀──replay (dvx wal dead-letter replay)──▶ store
//
// The shipper only appends; `replay` reads every entry, inserts the records (split like a batch),
// appends again those refused once more and moves the checkpoint past the rest. The two can run in
// different processes, so each opens the spool under a lock file (pid inside; a dead holder's lock is
// taken over) and closes it before letting go.

export const DEAD_LETTER_DIR = 'dead-letter';
const LOCK_FILE = 'dead-letter.lock';

export interface DeadLetter {
  /** The record's id, when it has one. */
  id: string | null;
  table: string;
  dead_lettered_at: string;
  /** rejected: the store refused the record; unparseable: the WAL frame is not a JSON object. */
  reason: 'rejected' | 'unparseable';
  error: { name: string; message: string; store_code?: string };
  record?: Record<string, unknown>;
  /** An unparseable frame's payload as text. */
  raw?: string;
  /** Where the record was in the table's WAL. */
  wal_position?: Position;
  /** Replays that the store refused again. */
  replays?: number;
}

export interface ReplayResult {
  shipped: DeadLetter[];
  kept: DeadLetter[];
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** An exclusive lock file holding our pid; resolves with its release. */
async function acquire(path: string, waitMs: number, log: Logger): Promise<() => Promise<void>> {
  const end = Date.now() + waitMs;
  for (;;) {
    try {
      const handle = await open(path, 'wx');
      try {
        await handle.writeFile(String(process.pid));
      } finally {
        await handle.close();
      }
      return async () => {
        try {
          await unlink(path);
        } catch (err) {
          // A lock left behind is taken over once we are gone (our pid is in it): no harm, but say so.
          log.warn({ err, lock: path }, 'dead-letter lock not removed');
        }
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    // Unreadable (removed by its holder meanwhile) reads as empty: the staleness check below decides.
    const holder = Number((await readFile(path, 'utf8').catch(() => '')).trim());
    // An empty lock is a holder between create and write, unless it is old (it died in between).
    const stale =
      Number.isInteger(holder) && holder > 0
        ? !alive(holder)
        : Date.now() -
            (await stat(path).then(
              (s) => s.mtimeMs,
              () => 0,
            )) >
          5000;
    if (stale) {
      log.warn({ lock: path, holder }, 'dead-letter lock of a process that is gone taken over');
      await unlink(path).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') throw err;
      });
      continue;
    }
    if (Date.now() >= end)
      throw new DeadLetterBusyError(`dead-letter spool ${path} is held by process ${holder || '?'}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A dead-letter frame as an entry; a frame that is not one (damaged on disk) is kept as unparseable. */
export function deadLetterEntry(table: string, payload: Buffer): DeadLetter {
  const text = payload.toString('utf8');
  try {
    const entry = JSON.parse(text) as DeadLetter;
    if (entry && typeof entry === 'object' && typeof entry.dead_lettered_at === 'string') return entry;
  } catch {
    // falls through: the frame is kept as it is
  }
  return {
    id: null,
    table,
    dead_lettered_at: new Date().toISOString(),
    reason: 'unparseable',
    error: { name: 'DeadLetterEntryError', message: 'dead-letter frame is not an entry' },
    raw: text,
  };
}

export class DeadLetterSpool {
  readonly table: AuditTable;
  /** The spool's directory: <table dir>/dead-letter. */
  readonly dir: string;
  #tableDir: string;
  #log: Logger;
  #maxBytes: number | undefined;

  constructor(tableDir: string, table: AuditTable, options: { log?: Logger; maxBytes?: number } = {}) {
    this.table = table;
    this.#tableDir = tableDir;
    this.dir = join(tableDir, DEAD_LETTER_DIR);
    this.#log = options.log ?? silentLogger();
    this.#maxBytes = options.maxBytes;
  }

  async #locked<T>(waitMs: number, fn: (wal: WalTable) => Promise<T>): Promise<T> {
    const release = await acquire(join(this.#tableDir, LOCK_FILE), waitMs, this.#log);
    try {
      const wal = await WalTable.open(this.dir, `${this.table}/${DEAD_LETTER_DIR}`, {
        log: this.#log,
        maxBytes: this.#maxBytes,
      });
      try {
        return await fn(wal);
      } finally {
        await wal.close();
      }
    } finally {
      await release();
    }
  }

  async #entries(wal: WalTable): Promise<{ entries: DeadLetter[]; next: Position }> {
    const entries: DeadLetter[] = [];
    let next = wal.checkpoint;
    for (;;) {
      const batch = await wal.read(next, 10_000);
      if (batch.records.length === 0) break;
      for (const r of batch.records) entries.push(deadLetterEntry(this.table, r.payload));
      next = batch.next;
    }
    return { entries, next };
  }

  /** Appends the entries durably; resolves with the number of entries now pending. */
  add(entries: DeadLetter[]): Promise<number> {
    return this.#locked(2000, async (wal) => {
      await Promise.all(entries.map((e) => wal.append(e)));
      return (await this.#entries(wal)).entries.length;
    });
  }

  /** Entries not yet replayed (read-only callers use `dvx wal dead-letter list`). */
  async pending(): Promise<number> {
    try {
      await access(this.dir);
    } catch {
      return 0; // no spool directory: nothing was ever dead-lettered in this table
    }
    return this.#locked(2000, async (wal) => (await this.#entries(wal)).entries.length);
  }

  /**
   * Inserts every dead-lettered record again, as it is: those the store takes leave the spool, those
   * it refuses again stay (with its new error), unparseable frames stay. A store that is unavailable
   * fails the replay and changes nothing.
   */
  replay(store: AuditWriter): Promise<ReplayResult> {
    return this.#locked(30_000, async (wal) => {
      const { entries, next } = await this.#entries(wal);
      // A crash between dead-lettering and the shipper's checkpoint dead-letters a record twice: once is enough.
      const seen = new Set<string>();
      const unique = entries.filter((e) => e.id === null || (!seen.has(e.id) && seen.add(e.id)));
      const replayable = unique.filter((e) => e.record && typeof e.record === 'object');
      const refused = new Map(
        (
          await insertBisecting(
            store,
            this.table,
            replayable.map((e) => e.record!),
          )
        ).map((r) => [r.row, r.err]),
      );
      const shipped: DeadLetter[] = [];
      const kept: DeadLetter[] = unique.filter((e) => !replayable.includes(e));
      for (const e of replayable) {
        const err = refused.get(e.record!);
        if (!err) shipped.push(e);
        else
          kept.push({
            ...e,
            error: { name: err.name, message: err.message, store_code: err.storeCode },
            replays: (e.replays ?? 0) + 1,
          });
      }
      // The kept entries are written again past `next` before the checkpoint moves over the old ones.
      await Promise.all(kept.map((e) => wal.append(e)));
      await wal.commit(next);
      return { shipped, kept };
    });
  }
}
