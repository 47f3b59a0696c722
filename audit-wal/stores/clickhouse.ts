import { readFile } from 'node:fs/promises';
import { ClickHouseLogLevel, createClient, type ClickHouseClient } from '@clickhouse/client';
import type { AuditStore } from '../store.ts';
import { StoreRejectedError, StoreUnavailableError } from '../errors.ts';
import type { AuditTable } from '../sink.ts';
import { clickhouseRow, mapRows, STORE_TABLE } from '../rows.ts';
import type { AuditQuery } from '../query.ts';
import {
  CH_EVENT_SELECT,
  chLlmSelect,
  chString,
  clickhouseWhere,
  toLlmEntry,
  toRecord,
  type LlmQuery,
  type ReadRecord,
} from '../read.ts';

// ClickHouse over its HTTP interface (JSONEachRow). ReplacingMergeTree keyed on the id collapses
// retried rows; readers use LIMIT 1 BY id to see each record once before the merge.

const SCHEMA = new URL('../../deploy/schema/clickhouse.sql', import.meta.url);

/**
 * ClickHouse error codes that mean the data itself cannot be stored (CANNOT_PARSE_*, TYPE_MISMATCH,
 * INCORRECT_DATA, a value out of its type's range, …). ClickHouse answers some of them with HTTP 500
 * (18.16 does for code 27), so the status says nothing: the code decides.
 */
const CH_DATA_ERRORS = new Set([
  6, // CANNOT_PARSE_TEXT
  25, // CANNOT_PARSE_ESCAPE_SEQUENCE (a lone UTF-16 surrogate in a string)
  26, // CANNOT_PARSE_QUOTED_STRING
  27, // CANNOT_PARSE_INPUT_ASSERTION_FAILED (1.5 or 1e20 for a UInt16)
  38, // CANNOT_PARSE_DATE
  41, // CANNOT_PARSE_DATETIME
  53, // TYPE_MISMATCH
  69, // ARGUMENT_OUT_OF_BOUND
  70, // CANNOT_CONVERT_TYPE
  72, // CANNOT_PARSE_NUMBER (-1 for an unsigned column)
  117, // INCORRECT_DATA
  131, // TOO_LARGE_STRING_SIZE
  321, // VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
  349, // CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
]);

/**
 * Rejected: a data error by code (the client parses `Code: N. … (TYPE)` of current servers into
 * ClickHouseError; 18.16's `Code: N, e.displayText() = …` stays a plain Error, read here) or by a
 * CANNOT_PARSE_ type name. Everything else is unavailable and retried: NETWORK_ERROR, TIMEOUT_EXCEEDED,
 * TOO_MANY_PARTS, memory limits, a missing table, and connection errors (refused, reset, timeout).
 */
export function classifyClickHouseError(err: unknown): StoreRejectedError | StoreUnavailableError {
  const message = (err as Error | null)?.message ?? String(err);
  const e = err as { code?: unknown; type?: unknown } | null;
  const code =
    typeof e?.code === 'string' && /^\d+$/.test(e.code)
      ? Number(e.code)
      : Number(/^Code: (\d+)[.,]/.exec(message)?.[1] ?? NaN);
  const type = typeof e?.type === 'string' ? e.type : undefined;
  if (CH_DATA_ERRORS.has(code) || type?.startsWith('CANNOT_PARSE_')) {
    return new StoreRejectedError(
      `clickhouse rejected the batch: ${message.split('\n')[0]}`,
      `${code}${type ? ` ${type}` : ''}`,
      err,
    );
  }
  const storeCode = Number.isNaN(code)
    ? typeof e?.code === 'string'
      ? e.code
      : undefined
    : `${code}${type ? ` ${type}` : ''}`;
  return new StoreUnavailableError(`clickhouse unavailable: ${message.split('\n')[0]}`, storeCode, err);
}

interface AddedColumn {
  table: AuditTable;
  name: string;
  type: string;
  after: string;
}

// Columns added after the first release (the schema file creates them in new tables).
const ADDED_COLUMNS: readonly AddedColumn[] = [
  { table: 'llm_audit_log', name: 'inspection_failures', type: "String DEFAULT '[]'", after: 'inspection_failopen' },
];

export class ClickHouseStore implements AuditStore {
  readonly kind = 'clickhouse' as const;
  #client: ClickHouseClient;
  #db: string;

  constructor(url: URL) {
    this.#db = decodeURIComponent(url.pathname.replace(/^\//, '')) || 'default';
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(this.#db))
      throw new Error(`clickhouse database name "${this.#db}" is not a plain identifier`);
    this.#client = createClient({
      url: `http://${url.host}`,
      username: decodeURIComponent(url.username) || 'default',
      password: decodeURIComponent(url.password),
      request_timeout: 30_000,
      // Failures reach the shipper, which logs and retries them; the client's own console logging is off.
      log: { level: ClickHouseLogLevel.OFF },
    });
  }

  async ensureSchema(): Promise<void> {
    await this.#client.command({ query: `CREATE DATABASE IF NOT EXISTS ${this.#db}` });
    const sql = (await readFile(SCHEMA, 'utf8')).replaceAll('{db}', this.#db);
    for (const statement of sql
      .split(/^;\s*$/m)
      .map((s) => s.replace(/^--.*$/gm, '').trim())
      .filter(Boolean)) {
      await this.#client.command({ query: statement });
    }
    for (const c of ADDED_COLUMNS) await this.#addColumn(c);
  }

  /**
   * An additive migration for a table created before the column existed. ClickHouse 18.16 has no
   * `ADD COLUMN IF NOT EXISTS`: look in system.columns, add it, and if another process added it
   * first, its "already exists" is fine once system.columns shows it.
   */
  async #addColumn(c: AddedColumn): Promise<void> {
    const has = async () =>
      (
        (await (
          await this.#client.query({
            query: `SELECT name FROM system.columns WHERE database = ${chString(this.#db)} AND table = ${chString(c.table)} AND name = ${chString(c.name)}`,
            format: 'JSONEachRow',
          })
        ).json()) as unknown[]
      ).length > 0;
    if (await has()) return;
    try {
      await this.#client.command({
        query: `ALTER TABLE ${this.#db}.${c.table} ADD COLUMN ${c.name} ${c.type} AFTER ${c.after}`,
      });
    } catch (err) {
      if (!(await has())) throw err;
    }
  }

  async insert(table: AuditTable, records: Record<string, unknown>[]): Promise<void> {
    if (records.length === 0) return;
    const values = mapRows(table, records, clickhouseRow);
    try {
      // One request, parsed as one block (a batch is far below max_insert_block_size): a row that fails
      // to parse fails the whole insert and nothing of it is written.
      await this.#client.insert({ table: `${this.#db}.${STORE_TABLE[table]}`, values, format: 'JSONEachRow' });
    } catch (err) {
      throw classifyClickHouseError(err);
    }
  }

  /**
   * Two passes: the page's ids from the light columns (sorting key, filters), then its rows by id within
   * the page's time span, under the same conditions. A retried batch may have left a row twice until
   * the merge: LIMIT 1 BY id (the copies sort next to each other) rather than FINAL (single-threaded).
   */
  async readEvents(q: AuditQuery): Promise<ReadRecord[]> {
    const where = clickhouseWhere(q);
    if (q.llm) return this.#readWithLlm(q, where);
    // A platform operator's control-plane events of every org: the time-ordered view (narrowed to one
    // org, the base table's (org_id, event_time) key serves better).
    const everyOrgEvents =
      q.predicate.orgs === 'all' &&
      q.predicate.kinds?.length === 1 &&
      q.predicate.kinds[0] === 'event' &&
      !q.filters.org;
    const table = `${this.#db}.${everyOrgEvents ? 'audit_events_cp' : 'audit_events'}`;
    const order = 'ORDER BY event_time, event_time_ms, id LIMIT 1 BY id';
    const page = (await (
      await this.#client.query({
        query: `SELECT id, toUInt32(toUnixTimestamp(event_time)) AS s FROM ${table} WHERE ${where} ${order} LIMIT ${Math.trunc(q.offset)}, ${Math.trunc(q.limit)}`,
        format: 'JSONEachRow',
      })
    ).json()) as { id: string; s: number }[];
    if (page.length === 0) return [];
    const lo = Math.min(...page.map((r) => Number(r.s)));
    const hi = Math.max(...page.map((r) => Number(r.s)));
    const rows = (await (
      await this.#client.query({
        query: `SELECT ${CH_EVENT_SELECT} FROM ${table}
              WHERE ${where} AND event_time >= toDateTime(${lo}) AND event_time <= toDateTime(${hi}) AND id IN (${page.map((r) => chString(r.id)).join(', ')})
              ${order}`,
        format: 'JSONEachRow',
      })
    ).json()) as Record<string, unknown>[];
    return rows.map(toRecord);
  }

  /**
   * The events and the LLM calls (read.ts, chLlmSelect) in one pass: both tables under the same
   * conditions, merged in (event_time, id) order. The enclave's own store (the broker's reads).
   */
  async #readWithLlm(q: AuditQuery, where: string): Promise<ReadRecord[]> {
    const rs = await this.#client.query({
      query: `SELECT * FROM (
                SELECT ${CH_EVENT_SELECT}, kind FROM ${this.#db}.audit_events WHERE ${where}
                UNION ALL
                ${chLlmSelect(`${this.#db}.llm_audit_log`)} WHERE ${where}
              ) ORDER BY ts, id LIMIT 1 BY id LIMIT ${Math.trunc(q.offset)}, ${Math.trunc(q.limit)}`,
      format: 'JSONEachRow',
    });
    return ((await rs.json()) as Record<string, unknown>[]).map(toRecord);
  }

  async readLlm(q: LlmQuery): Promise<Record<string, unknown>[]> {
    const rs = await this.#client.query({
      query: `SELECT *, (toUInt64(toUnixTimestamp(event_time)) * 1000 + event_time_ms) AS ts FROM ${this.#db}.llm_audit_log
              WHERE org_id = ${chString(q.org)} AND agent_id = ${chString(q.agentId)}
              ORDER BY event_time, event_time_ms, id LIMIT 1 BY id LIMIT ${Math.trunc(q.offset)}, ${Math.trunc(q.limit)}`,
      format: 'JSONEachRow',
    });
    return ((await rs.json()) as Record<string, unknown>[]).map(toLlmEntry);
  }

  /** A DELETE mutation per table, waited for (mutations run in the background). */
  async eraseOrg(org: string): Promise<number> {
    let n = 0;
    for (const table of ['audit_events', 'llm_audit_log', 'tool_call_decisions']) {
      const rs = await this.#client.query({
        query: `SELECT count() AS n FROM ${this.#db}.${table} WHERE org_id = ${chString(org)}`,
        format: 'JSONEachRow',
      });
      const count = Number(((await rs.json()) as { n: string }[])[0]?.n ?? 0);
      if (count === 0) continue;
      await this.#client.command({ query: `ALTER TABLE ${this.#db}.${table} DELETE WHERE org_id = ${chString(org)}` });
      n += count;
      // The platform view holds copies of the same rows (not counted twice).
      if (table === 'audit_events')
        await this.#client.command({
          query: `ALTER TABLE ${this.#db}.\`.inner.audit_events_cp\` DELETE WHERE org_id = ${chString(org)}`,
        });
    }
    for (let i = 0; i < 600; i++) {
      const rs = await this.#client.query({
        query: `SELECT count() AS n FROM system.mutations WHERE database = ${chString(this.#db)} AND is_done = 0`,
        format: 'JSONEachRow',
      });
      if (Number(((await rs.json()) as { n: string }[])[0]?.n ?? 0) === 0) return n;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error('ClickHouse erasure mutations did not finish within 60 s');
  }

  close(): Promise<void> {
    return this.#client.close();
  }
}
