import { DsnError } from './errors.ts';
import type { AuditTable } from './sink.ts';
import type { AuditQuery } from './query.ts';
import type { LlmQuery, ReadRecord } from './read.ts';

// Where shipped audit goes: ClickHouse (`clickhouse://[user:pass@]host:port/db`, its HTTP interface),
// PostgreSQL (`postgres://…`) or PGlite (`pglite://DIR`, embedded). Each store applies its schema
// from deploy/schema/ on open and inserts idempotently by record id.

/** What the shipper needs of a store: its schema and idempotent inserts. */
export interface AuditWriter {
  readonly kind: 'clickhouse' | 'postgres' | 'pglite';
  ensureSchema(): Promise<void>;
  /**
   * Inserts a batch, all or nothing. Rejects with StoreRejectedError when the store refuses the data
   * (the shipper then splits the batch to find the records) and StoreUnavailableError when it cannot
   * take it now (retried); each store classifies its own errors.
   */
  insert(table: AuditTable, records: Record<string, unknown>[]): Promise<void>;
  close(): Promise<void>;
}

export interface AuditStore extends AuditWriter {
  /** audit_events rows under the query's predicate and filters, in (event_time, id) order. */
  readEvents(q: AuditQuery): Promise<ReadRecord[]>;
  /** One agent's LLM audit entries in its org, in (event_time, id) order. */
  readLlm(q: LlmQuery): Promise<Record<string, unknown>[]>;
  /** Deletes every row of an org from both tables (per-org erasure); the number of rows removed. */
  eraseOrg(org: string): Promise<number>;
}

export async function openStore(dsn: string): Promise<AuditStore> {
  let url: URL;
  try {
    url = new URL(dsn);
  } catch {
    throw new DsnError(
      `--audit-dsn "${dsn.replace(/\/\/[^@/]*@/, '//***@')}" is not a URL (clickhouse://…, postgres://…, pglite://DIR)`,
    );
  }
  switch (url.protocol) {
    case 'clickhouse:': {
      const { ClickHouseStore } = await import('./stores/clickhouse.ts');
      return new ClickHouseStore(url);
    }
    case 'postgres:':
    case 'postgresql:': {
      const { PostgresStore } = await import('./stores/postgres.ts');
      return PostgresStore.connect(dsn);
    }
    case 'pglite:': {
      const { PostgresStore } = await import('./stores/postgres.ts');
      return PostgresStore.embedded(dsn.slice('pglite://'.length));
    }
    default:
      throw new DsnError(`--audit-dsn scheme "${url.protocol}" is not supported (clickhouse, postgres, pglite)`);
  }
}
