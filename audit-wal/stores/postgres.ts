import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';
import type { AuditStore } from '../store.ts';
import { StoreRejectedError, StoreUnavailableError } from '../errors.ts';
import type { AuditTable } from '../sink.ts';
import { COLUMNS, mapRows, postgresRow, STORE_TABLE } from '../rows.ts';
import type { AuditQuery } from '../query.ts';
import { PG_EVENTS_WITH_LLM, postgresWhere, toLlmEntry, toRecord, type LlmQuery, type ReadRecord } from '../read.ts';

// PostgreSQL (pg) and PGlite share the schema and the statement: a batch goes in as one JSON
// parameter, `json_populate_recordset` turns it into rows, and `ON CONFLICT (id) DO NOTHING` makes a
// retried batch a no-op.

/** PGlite instances open in this process, by directory. */
const EMBEDDED = new Map<string, { db: PGlite; refs: number }>();

const SCHEMA = new URL('../../deploy/schema/postgres.sql', import.meta.url);

/**
 * Rejected: SQLSTATE class 22 (data exception: 22P05 an untranslatable character such as NUL, 22021 a
 * bad byte sequence, 22003 a number out of range, 22P02 malformed input) and 23 (integrity constraint).
 * Everything else is unavailable and retried: class 08 (connection), 57 (shutdown, cannot connect now),
 * 53 (out of resources), 40 (serialization), 42 (a missing table or privilege is the operator's to fix,
 * not the record's), and errors without a SQLSTATE (refused, reset, pool or connect timeout).
 */
export function classifyPostgresError(err: unknown): StoreRejectedError | StoreUnavailableError {
  const code = (err as { code?: unknown } | null)?.code;
  const message = (err as Error | null)?.message ?? String(err);
  if (typeof code === 'string' && /^2[23][0-9A-Z]{3}$/.test(code))
    return new StoreRejectedError(`postgres rejected the batch: ${message} (SQLSTATE ${code})`, code, err);
  return new StoreUnavailableError(
    `postgres unavailable: ${message}${typeof code === 'string' ? ` (${code})` : ''}`,
    typeof code === 'string' ? code : undefined,
    err,
  );
}

interface Query {
  query(sql: string, params?: unknown[]): Promise<{ rows: unknown[] }>;
  exec(sql: string): Promise<unknown>;
  close(): Promise<void>;
}

export class PostgresStore implements AuditStore {
  readonly kind: 'postgres' | 'pglite';
  #db: Query;

  private constructor(kind: 'postgres' | 'pglite', db: Query) {
    this.kind = kind;
    this.#db = db;
  }

  static connect(dsn: string): PostgresStore {
    const pool = new pg.Pool({ connectionString: dsn, max: 4, connectionTimeoutMillis: 5000 });
    pool.on('error', () => {}); // idle-client errors surface on the next query
    return new PostgresStore('postgres', {
      query: (sql, params) => pool.query(sql, params),
      exec: (sql) => pool.query(sql),
      close: () => pool.end(),
    });
  }

  /**
   * PGlite in `dir`. Stores opened on one directory in one process share one PGlite (a directory can be
   * open only once): `dvx dev` runs the broker, llmproxy and the gateway in one process over the enclave's
   * one audit store, as they share one store in production. The last close closes it.
   */
  static embedded(dir: string): PostgresStore {
    const key = resolve(dir);
    let shared = EMBEDDED.get(key);
    if (!shared) {
      shared = { db: new PGlite(key), refs: 0 };
      EMBEDDED.set(key, shared);
    }
    shared.refs++;
    const { db } = shared;
    let closed = false;
    return new PostgresStore('pglite', {
      query: (sql, params) => db.query(sql, params),
      exec: (sql) => db.exec(sql),
      close: async () => {
        if (closed) return;
        closed = true;
        const s = EMBEDDED.get(key);
        if (!s || s.db !== db || --s.refs > 0) return;
        EMBEDDED.delete(key);
        await db.close();
      },
    });
  }

  async ensureSchema(): Promise<void> {
    await this.#db.exec(await readFile(SCHEMA, 'utf8'));
  }

  async insert(table: AuditTable, records: Record<string, unknown>[]): Promise<void> {
    if (records.length === 0) return;
    const cols = COLUMNS[table].join(', ');
    const rows = mapRows(table, records, postgresRow);
    try {
      await this.#db.query(
        `INSERT INTO ${STORE_TABLE[table]} (${cols}) SELECT ${cols} FROM json_populate_recordset(NULL::${STORE_TABLE[table]}, $1::json) ON CONFLICT (id) DO NOTHING`,
        [JSON.stringify(rows)],
      );
    } catch (err) {
      throw classifyPostgresError(err);
    }
  }

  async readEvents(q: AuditQuery): Promise<ReadRecord[]> {
    const { where, params } = postgresWhere(q);
    const { rows } = await this.#db.query(
      `SELECT * FROM ${q.llm ? PG_EVENTS_WITH_LLM : 'audit_events'} WHERE ${where} ORDER BY event_time, id LIMIT ${Math.trunc(q.limit)} OFFSET ${Math.trunc(q.offset)}`,
      params,
    );
    return (rows as Record<string, unknown>[]).map(toRecord);
  }

  async readLlm(q: LlmQuery): Promise<Record<string, unknown>[]> {
    const { rows } = await this.#db.query(
      `SELECT * FROM llm_audit_log WHERE org_id = $1 AND agent_id = $2 ORDER BY event_time, id LIMIT ${Math.trunc(q.limit)} OFFSET ${Math.trunc(q.offset)}`,
      [q.org, q.agentId],
    );
    return (rows as Record<string, unknown>[]).map(toLlmEntry);
  }

  async eraseOrg(org: string): Promise<number> {
    let n = 0;
    for (const table of ['audit_events', 'llm_audit_log', 'tool_call_decisions']) {
      const { rows } = await this.#db.query(
        `WITH gone AS (DELETE FROM ${table} WHERE org_id = $1 RETURNING 1) SELECT count(*)::int AS n FROM gone`,
        [org],
      );
      n += Number((rows[0] as { n: number }).n);
    }
    return n;
  }

  close(): Promise<void> {
    return this.#db.close();
  }
}
