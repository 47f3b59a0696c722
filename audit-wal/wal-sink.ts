import { join } from 'node:path';
import type { Registry } from 'prom-client';
import type { Logger } from '../core/logger.ts';
import { counter, gauge, histogram } from '../core/metrics.ts';
import { DeadLetterSpool } from './dead-letter.ts';
import { lockWalDir } from './dir-lock.ts';
import { AuditFlushTimeoutError } from './errors.ts';
import { Shipper, type ShipperMetrics } from './shipper.ts';
import type { AuditSink, AuditTable } from './sink.ts';
import { openStore, type AuditStore, type AuditWriter } from './store.ts';
import { WalTable, type WalMetrics } from './wal-table.ts';

// The durable audit sink: a WAL per table under --audit-wal-dir, each shipped to the --audit-dsn store.
//
//   append ─▶ wal/<table>/NNNNNNNNNNNN.wal ─(durable)─▶ resolved
//                      └── shipper ─▶ ClickHouse | Postgres | PGlite ─▶ checkpoint ─▶ old segments deleted
//                             └── records the store rejects ─▶ wal/<table>/dead-letter/ (dvx wal dead-letter)

export const TABLES: readonly AuditTable[] = ['llm_audit_log', 'audit_events', 'tool_call_decisions', 'network_flow'];
const DEFAULT_SHIPPED_TIMEOUT_MS = 60_000;
const SHIPPED_POLL_MS = 20;

export interface WalSinkOptions {
  dir: string;
  dsn: string;
  maxBytes?: number;
  segmentBytes?: number;
  log: Logger;
  registry: Registry;
  shipper?: {
    batchRows?: number;
    idleMs?: number;
    backoffMs?: { base: number; max: number };
    refusedAllProbe?: number;
    refusedAllRounds?: number;
  };
  /** Tables this component writes; others are not opened. */
  tables?: readonly AuditTable[];
  /** The store, when the component also reads it (one PGlite instance per directory); closed with the sink. */
  store?: AuditStore;
}

export function walMetrics(registry: Registry): WalMetrics & ShipperMetrics {
  const appended = counter(registry, 'dvx_audit_wal_appended_total', 'Audit records appended', ['table']);
  const durable = histogram(
    registry,
    'dvx_audit_wal_durable_seconds',
    'Append-to-durable latency',
    ['table'],
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
  );
  const dropped = counter(registry, 'dvx_audit_wal_dropped_total', 'Audit records dropped at the WAL ceiling', [
    'table',
  ]);
  const segments = gauge(registry, 'dvx_audit_wal_segments', 'WAL segment files', ['table']);
  const unshipped = gauge(registry, 'dvx_audit_wal_unshipped_bytes', 'WAL bytes not yet shipped', ['table']);
  const shipped = counter(registry, 'dvx_audit_shipped_total', 'Audit rows acknowledged by the store', ['table']);
  const lag = gauge(registry, 'dvx_audit_ship_lag_seconds', 'Age of the newest shipped record when shipped', ['table']);
  const failed = counter(
    registry,
    'dvx_audit_ship_failures_total',
    'Failed shipping attempts, by the step that failed (read, store, refused_all, dead_letter, checkpoint)',
    ['table', 'reason'],
  );
  const deadLettered = counter(
    registry,
    'dvx_audit_dead_letter_records_total',
    'Audit records moved to the dead-letter spool (rejected by the store, or unparseable)',
    ['table', 'reason'],
  );
  const deadLetterPending = gauge(
    registry,
    'dvx_audit_dead_letter_pending',
    'Records in the dead-letter spool, as of its last change in this process',
    ['table'],
  );
  return {
    appended: (table) => appended.inc({ table }),
    durable: (table, s) => durable.observe({ table }, s),
    dropped: (table) => dropped.inc({ table }),
    segments: (table, n) => segments.set({ table }, n),
    unshipped: (table, n) => unshipped.set({ table }, n),
    shipped: (table, n) => shipped.inc({ table }, n),
    lag: (table, s) => lag.set({ table }, s),
    failed: (table, reason) => failed.inc({ table, reason }),
    deadLettered: (table, reason, n) => deadLettered.inc({ table, reason }, n),
    deadLetterPending: (table, n) => deadLetterPending.set({ table }, n),
  };
}

export class WalSink implements AuditSink {
  #tables = new Map<AuditTable, WalTable>();
  #shippers: Shipper[] = [];
  #store: AuditStore;
  #unlock: () => Promise<void> = async () => {};

  private constructor(store: AuditStore) {
    this.#store = store;
  }

  static async open(options: WalSinkOptions): Promise<WalSink> {
    // One writer per directory (audit-wal/dir-lock.ts): taken before anything is opened.
    const unlock = await lockWalDir(options.dir);
    try {
      return await WalSink.#open(options, unlock);
    } catch (err) {
      await unlock();
      throw err;
    }
  }

  static async #open(options: WalSinkOptions, unlock: () => Promise<void>): Promise<WalSink> {
    const store = options.store ?? (await openStore(options.dsn));
    try {
      await store.ensureSchema();
    } catch (err) {
      // The store may be down at start: records still spool; the shipper retries (schema first).
      options.log.warn({ err, store: store.kind }, 'audit store unreachable at start; spooling to the WAL');
    }
    const sink = new WalSink(store);
    sink.#unlock = unlock;
    const metrics = walMetrics(options.registry);
    let schemaReady = false;
    const ensured: AuditWriter = {
      kind: store.kind,
      ensureSchema: () => store.ensureSchema(),
      insert: async (table, rows) => {
        if (!schemaReady) {
          await store.ensureSchema();
          schemaReady = true;
        }
        await store.insert(table, rows);
      },
      close: () => store.close(),
    };
    for (const name of options.tables ?? TABLES) {
      const table = await WalTable.open(join(options.dir, name), name, {
        maxBytes: options.maxBytes,
        segmentBytes: options.segmentBytes,
        log: options.log,
        metrics,
      });
      sink.#tables.set(name, table);
      const deadLetter = new DeadLetterSpool(join(options.dir, name), name, {
        log: options.log,
        maxBytes: options.maxBytes,
      });
      const shipper = new Shipper(name, table, ensured, { ...options.shipper, log: options.log, metrics, deadLetter });
      shipper.start();
      sink.#shippers.push(shipper);
    }
    return sink;
  }

  append(table: AuditTable, record: Record<string, unknown>): Promise<void> {
    const wal = this.#tables.get(table);
    if (!wal) return Promise.reject(new Error(`audit table ${table} is not open in this component`));
    return wal.append(record);
  }

  table(name: AuditTable): WalTable | undefined {
    return this.#tables.get(name);
  }

  async flush(): Promise<void> {
    // Appends resolve only once durable: nothing is buffered in memory to flush.
  }

  /**
   * Resolves once every record durable when it was called has reached the store (the shippers'
   * checkpoints passed it; a dead-lettered record counts as passed): what erasure needs before it
   * sweeps the store, so no record of the org ships after the sweep. Throws past `timeoutMs`.
   */
  async shipped(timeoutMs = DEFAULT_SHIPPED_TIMEOUT_MS): Promise<void> {
    const targets = [...this.#tables.values()].map((table) => ({ table, end: table.end }));
    const deadline = Date.now() + timeoutMs;
    for (const { table, end } of targets) {
      while (!table.shippedTo(end)) {
        if (Date.now() >= deadline)
          throw new AuditFlushTimeoutError(
            `audit records of ${table.name} not shipped within ${timeoutMs} ms (is the store down?)`,
          );
        await new Promise((resolve) => setTimeout(resolve, SHIPPED_POLL_MS));
      }
    }
  }

  async close(): Promise<void> {
    await Promise.all(this.#shippers.map((s) => s.stop()));
    await Promise.all([...this.#tables.values()].map((t) => t.close()));
    await this.#store.close();
    await this.#unlock();
  }
}
