import type { Logger } from '../core/logger.ts';
import { silentLogger } from '../core/logger.ts';
import { insertBisecting } from './bisect.ts';
import { DeadLetterSpool, type DeadLetter } from './dead-letter.ts';
import { StoreRefusesAllError } from './errors.ts';
import type { AuditWriter } from './store.ts';
import type { AuditTable } from './sink.ts';
import type { WalRecord, WalTable } from './wal-table.ts';

// One shipper per table: read durable records from the checkpoint, insert them as one batch (up to
// 10,000 rows), commit the checkpoint once the store acknowledged, repeat.
//
// Every step runs supervised: a failure of reading the WAL, of the store, of the dead-letter spool or
// of the checkpoint is logged with its error, counted by step, and retried after a bounded, jittered
// backoff; the records wait in the WAL, never lost, and nothing escapes the loop. Two failures are not
// retried, because retrying cannot succeed and would hold back the whole table: a record that is not a
// JSON object, and a record the store rejects (the batch is split down to it, see bisect.ts). Those
// move to the table's dead-letter spool, durably, before the checkpoint passes them. Retrying a batch
// the store already took (wholly or in part) duplicates nothing: rows are keyed by id. A store that
// refuses every record it is offered is the store's problem (its schema), not the records': retried,
// reason `refused_all` (bisect.ts), never a whole WAL dead-lettered.

/**
 * The step that failed: the `reason` label of dvx_audit_ship_failures_total. `refused_all`: the store
 * rejected every record probed of a batch, a suspected store or schema problem.
 */
export type ShipStep = 'read' | 'store' | 'refused_all' | 'dead_letter' | 'checkpoint';

export interface ShipperMetrics {
  shipped(table: string, rows: number): void;
  lag(table: string, seconds: number): void;
  failed(table: string, reason: ShipStep): void;
  deadLettered(table: string, reason: DeadLetter['reason'], records: number): void;
  deadLetterPending(table: string, records: number): void;
}

export interface ShipperOptions {
  batchRows?: number;
  /** Longest wait for new records before looking again. */
  idleMs?: number;
  backoffMs?: { base: number; max: number };
  log?: Logger;
  metrics?: ShipperMetrics;
  /** Where refused records go; by default <table dir>/dead-letter. */
  deadLetter?: DeadLetterSpool;
  /**
   * A rejected batch of at least this many records is probed with as many of them one by one first;
   * none taken is a store problem, retried rather than dead-lettered (bisect.ts). Default 8.
   */
  refusedAllProbe?: number;
  /** How many times in a row one batch may fail every probe before it is split and dead-lettered. Default 10. */
  refusedAllRounds?: number;
}

export class Shipper {
  #table: WalTable;
  #store: AuditWriter;
  #name: AuditTable;
  #batchRows: number;
  #idleMs: number;
  #backoff: { base: number; max: number };
  #log: Logger;
  #metrics: ShipperMetrics | undefined;
  #deadLetter: DeadLetterSpool;
  #probe: number;
  #refusedAllRounds: number;
  #running = false;
  #loop: Promise<void> | null = null;
  #wake: (() => void) | null = null;

  constructor(name: AuditTable, table: WalTable, store: AuditWriter, options: ShipperOptions = {}) {
    this.#name = name;
    this.#table = table;
    this.#store = store;
    this.#batchRows = options.batchRows ?? 10_000;
    this.#idleMs = options.idleMs ?? 1000;
    this.#backoff = options.backoffMs ?? { base: 200, max: 30_000 };
    this.#log = options.log ?? silentLogger();
    this.#metrics = options.metrics;
    this.#deadLetter = options.deadLetter ?? new DeadLetterSpool(table.dir, name, { log: this.#log });
    this.#probe = options.refusedAllProbe ?? 8;
    this.#refusedAllRounds = options.refusedAllRounds ?? 10;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#loop = this.#supervise();
  }

  async #sleep(ms: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() {
        clearTimeout(timer);
        self.#wake = null;
        resolve();
      }
      this.#wake = done;
    });
  }

  /** Exponential, capped, with equal jitter: never a tight loop on a fault that persists. */
  #delay(failures: number): number {
    const cap = Math.min(this.#backoff.max, this.#backoff.base * 2 ** Math.min(failures - 1, 20));
    return cap / 2 + Math.random() * (cap / 2);
  }

  /** The loop below catches everything it does; this catches what its own error handling might throw. */
  async #supervise(): Promise<void> {
    let restarts = 0;
    while (this.#running) {
      try {
        await this.#run();
      } catch (err) {
        restarts++;
        try {
          this.#log.error({ err, table: this.#name }, 'audit shipper loop failed; restarting it');
        } catch {
          // nothing left to report with; the restart below is what matters
        }
        await this.#sleep(this.#delay(restarts));
      }
    }
  }

  async #run(): Promise<void> {
    let failures = 0;
    // A batch whose every probed record the store refuses is retried as a suspected store problem, but
    // not for ever: the records are an agent's, and hostile ones can fail every probe. After this many
    // rounds (minutes, with the backoff) the batch is split and what is refused dead-lettered.
    let refusedAll = 0;
    await this.#refreshPending();
    while (this.#running) {
      let step: ShipStep = 'read';
      let rows = 0;
      try {
        const { records, next } = await this.#table.read(this.#table.checkpoint, this.#batchRows);
        if (records.length === 0) {
          await Promise.race([this.#table.changed(this.#idleMs), this.#sleep(this.#idleMs)]);
          continue;
        }
        const { good, unparseable } = this.#parse(records);
        rows = good.length;
        step = 'store';
        const probe = refusedAll < this.#refusedAllRounds ? this.#probe : 0;
        if (probe === 0)
          this.#log.error(
            { table: this.#name, rows, rounds: refusedAll },
            'the audit store refused every probed record of this batch round after round; splitting it and dead-lettering what it refuses (dvx wal dead-letter replay once the store is fixed)',
          );
        const refused = await insertBisecting(this.#store, this.#name, good, { probe });
        const dead: DeadLetter[] = [...unparseable];
        const now = new Date().toISOString();
        for (const { row, err } of refused) {
          dead.push({
            id: typeof row.id === 'string' ? row.id : null,
            table: this.#name,
            dead_lettered_at: now,
            reason: 'rejected',
            error: { name: err.name, message: err.message, store_code: err.storeCode },
            record: row,
          });
        }
        if (dead.length > 0) {
          step = 'dead_letter';
          const pending = await this.#deadLetter.add(dead);
          this.#reportDead(
            dead,
            refused.map((r) => r.err),
            pending,
          );
        }
        step = 'checkpoint';
        await this.#table.commit(next);
        if (failures > 0)
          this.#log.info({ table: this.#name, after_attempts: failures + 1 }, 'audit shipping recovered');
        failures = 0;
        refusedAll = 0;
        this.#metrics?.shipped(this.#name, good.length - refused.length);
        const last = Date.parse(String(good.at(-1)?.event_time ?? ''));
        if (!Number.isNaN(last)) this.#metrics?.lag(this.#name, Math.max(0, (Date.now() - last) / 1000));
      } catch (err) {
        failures++;
        const delay = this.#delay(failures);
        if (err instanceof StoreRefusesAllError) {
          step = 'refused_all';
          refusedAll++;
          this.#log.error(
            { err, table: this.#name, reason: step, rows, attempt: failures, retry_in_ms: Math.round(delay) },
            'the audit store refuses every record it is offered (a changed schema?); the records wait in the WAL and are retried',
          );
        } else {
          this.#log.warn(
            { err, table: this.#name, reason: step, rows, attempt: failures, retry_in_ms: Math.round(delay) },
            `audit shipping failed (${step}); will retry`,
          );
        }
        this.#metrics?.failed(this.#name, step);
        await this.#sleep(delay);
      }
    }
  }

  /** Records as rows; a frame that is not a JSON object can never ship and goes to the dead-letter spool. */
  #parse(records: WalRecord[]): { good: Record<string, unknown>[]; unparseable: DeadLetter[] } {
    const good: Record<string, unknown>[] = [];
    const unparseable: DeadLetter[] = [];
    for (const r of records) {
      const text = r.payload.toString('utf8');
      let value: unknown;
      let problem: Error | null = null;
      try {
        value = JSON.parse(text);
        if (value === null || typeof value !== 'object' || Array.isArray(value))
          problem = new TypeError(
            `audit record is JSON but not an object (${value === null ? 'null' : Array.isArray(value) ? 'array' : typeof value})`,
          );
      } catch (err) {
        problem = err as Error;
      }
      if (problem === null) {
        good.push(value as Record<string, unknown>);
        continue;
      }
      this.#log.error(
        { err: problem, table: this.#name, wal_position: r.position, bytes: r.payload.length },
        'audit record in the WAL is not a JSON object; moving it to the dead-letter spool',
      );
      unparseable.push({
        id: null,
        table: this.#name,
        dead_lettered_at: new Date().toISOString(),
        reason: 'unparseable',
        error: { name: problem.name, message: problem.message },
        raw: text,
        wal_position: r.position,
      });
    }
    return { good, unparseable };
  }

  #reportDead(dead: DeadLetter[], errors: Error[], pending: number): void {
    const rejected = dead.filter((d) => d.reason === 'rejected');
    const unparseable = dead.length - rejected.length;
    if (rejected.length > 0) {
      this.#metrics?.deadLettered(this.#name, 'rejected', rejected.length);
      this.#log.error(
        {
          err: errors[0],
          table: this.#name,
          ids: rejected.map((d) => d.id),
          errors: rejected.map((d) => ({ id: d.id, store_code: d.error.store_code, message: d.error.message })),
          dead_letter_pending: pending,
        },
        'audit records the store rejects moved to the dead-letter spool (dvx wal dead-letter list)',
      );
    }
    if (unparseable > 0) this.#metrics?.deadLettered(this.#name, 'unparseable', unparseable);
    this.#metrics?.deadLetterPending(this.#name, pending);
  }

  async #refreshPending(): Promise<void> {
    try {
      this.#metrics?.deadLetterPending(this.#name, await this.#deadLetter.pending());
    } catch (err) {
      this.#log.warn({ err, table: this.#name }, 'dead-letter spool not readable; its pending gauge is stale');
    }
  }

  /** Stops after the batch in flight (a batch mid-retry is left in the WAL for the next start). */
  async stop(): Promise<void> {
    this.#running = false;
    this.#wake?.();
    await this.#loop;
  }
}
