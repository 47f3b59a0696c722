import { StoreRejectedError } from './errors.ts';
import type { AuditTable } from './sink.ts';

// Audit records as each store's rows. Records carry `event_time` (and `decided_at`) as an ISO 8601
// string; ClickHouse gets `DateTime` ("YYYY-MM-DD hh:mm:ss", UTC) plus the milliseconds apart; maps become key/value
// arrays there and jsonb in Postgres.
//
// Mapping is total: a record is any JSON object (the WAL holds what producers wrote), so a column's
// value may be an object where a string was meant. Text columns take primitives as they are and
// anything else as its JSON text, never through `String()` (which throws on `{"toString":1}`): a
// mapping that threw would look like a store that is down and block the table (docs/decisions.md, "Shipping goes on
// past a bad record and never crashes").

/** The store table a WAL table's records go to: a network flow is an audit event of kind `network_flow`. */
export const STORE_TABLE: Record<AuditTable, 'llm_audit_log' | 'audit_events' | 'tool_call_decisions'> = {
  llm_audit_log: 'llm_audit_log',
  audit_events: 'audit_events',
  tool_call_decisions: 'tool_call_decisions',
  network_flow: 'audit_events',
};

const AUDIT_EVENT_COLUMNS: readonly string[] = [
  'id',
  'event_time',
  'kind',
  'action',
  'actor',
  'actor_kind',
  'agent_id',
  'agent_name',
  'attrs',
  'dst',
  'dst_host',
  'dst_ip',
  'dst_port',
  'enclave_id',
  'enclave_name',
  'group_id',
  'identified',
  'namespace',
  'org_id',
  'outcome',
  'proto',
  'reason',
  'resource',
  'scope',
  'security_id',
  'session_id',
  'source',
  'src',
  'src_ip',
  'trace_id',
];

export const COLUMNS: Record<AuditTable, readonly string[]> = {
  llm_audit_log: [
    'id',
    'event_time',
    'org_id',
    'agent_id',
    'agent_name',
    'enclave_id',
    'format',
    'upstream_format',
    'path',
    'model',
    'status',
    'upstream_status',
    'latency_ms',
    'upstream_latency_ms',
    'overhead_ms',
    'request_bytes',
    'response_bytes',
    'input_tokens',
    'output_tokens',
    'decision',
    'findings',
    'inspection_failopen',
    'inspection_failures',
    'error',
  ],
  audit_events: AUDIT_EVENT_COLUMNS,
  network_flow: AUDIT_EVENT_COLUMNS,
  tool_call_decisions: [
    'id',
    'event_time',
    'call_id',
    'org_id',
    'agent_id',
    'agent_name',
    'enclave_id',
    'model',
    'tool',
    'tool_call_id',
    'args_digest',
    'arguments',
    'args_parsed',
    'rule',
    'inspector',
    'summary',
    'verdict',
    'outcome',
    'reason',
    'policy_version',
    'decided_by',
    'decided_at',
    'approval_id',
    'held_ms',
  ],
};

type Row = Record<string, unknown>;

const NUMERIC = new Set([
  'status',
  'upstream_status',
  'latency_ms',
  'upstream_latency_ms',
  'overhead_ms',
  'request_bytes',
  'response_bytes',
  'input_tokens',
  'output_tokens',
  'dst_port',
  'held_ms',
]);
/** Boolean columns: `true` only for a JSON true. */
const BOOLEAN = new Set(['inspection_failopen', 'identified', 'args_parsed']);
/** Time columns besides event_time (ISO 8601 in the record); ClickHouse keeps their milliseconds apart. */
const TIMES = new Set(['decided_at']);
const NULLABLE = new Set([
  'upstream_status',
  'upstream_latency_ms',
  'overhead_ms',
  'input_tokens',
  'output_tokens',
  'dst_port',
  'model',
  'format',
  'upstream_format',
  'error',
  'rule',
  'inspector',
  'summary',
  'approval_id',
]);

/** A text column's value from any JSON value. */
function text(v: unknown): string {
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return String(v);
  try {
    return JSON.stringify(v) ?? '';
  } catch {
    return ''; // not JSON data (a cycle): nothing of it can be stored as text
  }
}

/** A time column's value; one that is missing or does not parse is the record's event_time, else now. */
function time(record: Row, col = 'event_time'): Date {
  const v = record[col];
  const t = typeof v === 'string' ? new Date(v) : new Date(NaN);
  if (!Number.isNaN(t.getTime())) return t;
  return col === 'event_time' ? new Date() : time(record);
}

/** A row for Postgres: every column present, numbers as numbers, JSON columns as JSON. */
export function postgresRow(table: AuditTable, record: Row): Row {
  const row: Row = {};
  for (const col of COLUMNS[table]) {
    const v = record[col];
    if (col === 'event_time' || TIMES.has(col)) row[col] = time(record, col).toISOString();
    else if (col === 'findings' || col === 'inspection_failures') row[col] = Array.isArray(v) ? v : [];
    else if (col === 'attrs') row[col] = v && typeof v === 'object' && !Array.isArray(v) ? v : {};
    // A record of the network_flow spool is a network flow whatever it says.
    else if (col === 'kind') row[col] = table === 'network_flow' ? 'network_flow' : text(v ?? 'event');
    else if (col === 'decision') row[col] = text(v ?? 'allow');
    else if (BOOLEAN.has(col)) row[col] = v === true;
    else if (NUMERIC.has(col)) row[col] = typeof v === 'number' ? v : NULLABLE.has(col) ? null : 0;
    else row[col] = v === undefined || v === null ? (NULLABLE.has(col) ? null : '') : text(v);
  }
  return row;
}

export function clickhouseRow(table: AuditTable, record: Row): Row {
  const pg = postgresRow(table, record);
  const t = time(record);
  const row: Row = {};
  for (const [col, v] of Object.entries(pg)) {
    if (col === 'event_time') {
      row.event_time = t.toISOString().slice(0, 19).replace('T', ' ');
      row.event_time_ms = t.getUTCMilliseconds();
    } else if (TIMES.has(col)) {
      const at = new Date(v as string);
      row[col] = at.toISOString().slice(0, 19).replace('T', ' ');
      row[`${col}_ms`] = at.getUTCMilliseconds();
    } else if (col === 'findings' || col === 'inspection_failures') row[col] = JSON.stringify(v);
    else if (col === 'attrs') {
      const entries = Object.entries(v as Row);
      row.attrs_keys = entries.map(([k]) => k);
      row.attrs_values = entries.map(([, x]) => text(x));
    } else if (BOOLEAN.has(col)) row[col] = v ? 1 : 0;
    else if (v === null && !NUMERIC.has(col)) row[col] = '';
    else row[col] = v;
  }
  return row;
}

/**
 * `records` as rows by `map`; a record that cannot be mapped (mapping is total, so this is a bug) is a
 * rejection of the batch, which bisection narrows down to that record and dead-letters, never an
 * error the shipper would take for a store that is down and retry forever.
 */
export function mapRows(table: AuditTable, records: Row[], map: (table: AuditTable, record: Row) => Row): Row[] {
  try {
    return records.map((r) => map(table, r));
  } catch (err) {
    throw new StoreRejectedError(
      `a record cannot be mapped to a ${table} row: ${(err as Error)?.message ?? String(err)}`,
      undefined,
      err,
    );
  }
}
