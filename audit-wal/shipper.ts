import type { Logger } from '../core/logger.ts';
import { silentLogger } from '../core/logger.ts';
import type { AuditWriter } from './store.ts';
import type { AuditTable } from './sink.ts';
import type { WalTable } from './wal-table.ts';

// One shipper per table: read durable records from the checkpoint, insert them as one batch (up to
// 10,000 rows), commit the checkpoint once the store acknowledged, repeat. A failed insert is retried
// with exponential backoff and full jitter, forever: records wait in the WAL, never lost. Retrying a
// batch the store already took duplicates nothing (rows are keyed by id).

export interface ShipperMetrics {
  shipped(table: string, rows: number): void;
  lag(table: string, seconds: number): void;
  failed(table: string): void;
}

export interface ShipperOptions {
  batchRows?: number;
  /** Longest wait for new records before looking again. */
  idleMs?: number;
  backoffMs?: { base: number; max: number };
  log?: Logger;
  metrics?: ShipperMetrics;
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
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#loop = this.#run();
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

  async #run(): Promise<void> {
    let failures = 0;
    while (this.#running) {
      const { records, next } = await this.#table.read(this.#table.checkpoint, this.#batchRows);
      if (records.length === 0) {
        await Promise.race([this.#table.changed(this.#idleMs), this.#sleep(this.#idleMs)]);
        continue;
      }
      const rows = records.map((r) => JSON.parse(r.payload.toString('utf8')) as Record<string, unknown>);
      try {
        await this.#store.insert(this.#name, rows);
      } catch (err) {
        failures++;
        this.#metrics?.failed(this.#name);
        const delay = Math.random() * Math.min(this.#backoff.max, this.#backoff.base * 2 ** Math.min(failures, 20));
        this.#log.warn({ table: this.#name, rows: rows.length, attempt: failures, retry_in_ms: Math.round(delay), err: (err as Error).message }, 'audit shipping failed; will retry');
        await this.#sleep(delay);
        continue;
      }
      if (failures > 0) this.#log.info({ table: this.#name, after_attempts: failures + 1 }, 'audit shipping recovered');
      failures = 0;
      await this.#table.commit(next);
      this.#metrics?.shipped(this.#name, rows.length);
      const last = Date.parse(String(rows.at(-1)?.event_time ?? ''));
      if (!Number.isNaN(last)) this.#metrics?.lag(this.#name, Math.max(0, (Date.now() - last) / 1000));
    }
  }

  /** Stops after the batch in flight (a batch mid-retry is left in the WAL for the next start). */
  async stop(): Promise<void> {
    this.#running = false;
    this.#wake?.();
    await this.#loop;
  }
}
