import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';

// A SQL store: PostgreSQL through `pg`, or PGlite (Postgres in WASM) embedded. The same
// SQL runs on both; `transaction` gives one connection to a callback and commits or rolls back.

export interface Queryable {
  query<R = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<{ rows: R[] }>;
}

export interface Db extends Queryable {
  readonly kind: 'postgres' | 'pglite';
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export interface OpenDbOptions {
  /**
   * An idle pooled connection failed (the server restarted, the network dropped it): the pool replaces
   * it, and the caller logs and counts it. Without one, a process warning says it.
   */
  onPoolError?: (err: Error) => void;
}

export async function openDb(dsn: string, options: OpenDbOptions = {}): Promise<Db> {
  if (dsn.startsWith('pglite://')) {
    const db = new PGlite(dsn.slice('pglite://'.length));
    await db.waitReady;
    return {
      kind: 'pglite',
      query: async <R>(sql: string, params?: unknown[]) => ({ rows: (await db.query<R>(sql, params)).rows }),
      transaction: (fn) =>
        db.transaction((tx) =>
          fn({
            query: async <R>(sql: string, params?: unknown[]) => ({ rows: (await tx.query<R>(sql, params)).rows }),
          }),
        ),
      close: () => db.close(),
    };
  }
  const pool = new pg.Pool({ connectionString: dsn, max: 10, connectionTimeoutMillis: 5000 });
  pool.on('error', options.onPoolError ?? ((err) => process.emitWarning(err)));
  return {
    kind: 'postgres',
    query: async <R>(sql: string, params?: unknown[]) => ({ rows: (await pool.query(sql, params)).rows as R[] }),
    async transaction(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const out = await fn({
          query: async <R>(sql: string, params?: unknown[]) => ({
            rows: (await client.query(sql, params)).rows as R[],
          }),
        });
        await client.query('COMMIT');
        return out;
      } catch (err) {
        // The transaction's own error is the one worth raising; a failed ROLLBACK (a broken connection)
        // ends the transaction anyway when the client is released.
        await client.query('ROLLBACK').catch(() => {});
        throw err;
      } finally {
        client.release();
      }
    },
    close: () => pool.end(),
  };
}
