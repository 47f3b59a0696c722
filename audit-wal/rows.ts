import type { AuditTable } from './sink.ts';

// Audit records as each store's rows. Records carry `event_time` as an ISO 8601 string; ClickHouse
// gets `DateTime` ("YYYY-MM-DD hh:mm:ss", UTC) plus the milliseconds apart; maps become key/value
// arrays there and jsonb in Postgres.

export const COLUMNS: Record<AuditTable, readonly string[]> = {
  llm_audit_log: ['id', 'event_time', 'org_id', 'agent_id', 'agent_name', 'enclave_id', 'format', 'upstream_format', 'path', 'model', 'status',
    'upstream_status', 'latency_ms', 'upstream_latency_ms', 'overhead_ms', 'request_bytes', 'response_bytes', 'input_tokens', 'output_tokens', 'decision',
    'findings', 'inspection_failopen', 'inspection_failures', 'error'],
  audit_events: ['id', 'event_time', 'kind', 'action', 'actor', 'actor_kind', 'agent_id', 'agent_name', 'attrs', 'dst', 'dst_host', 'dst_ip',
    'dst_port', 'enclave_id', 'enclave_name', 'group_id', 'identified', 'namespace', 'org_id', 'outcome', 'proto', 'reason', 'resource', 'scope',
    'security_id', 'session_id', 'source', 'src', 'src_ip', 'trace_id'],
};

type Row = Record<string, unknown>;

const NUMERIC = new Set(['status', 'upstream_status', 'latency_ms', 'upstream_latency_ms', 'overhead_ms', 'request_bytes', 'response_bytes', 'input_tokens', 'output_tokens', 'dst_port']);
const NULLABLE = new Set(['upstream_status', 'upstream_latency_ms', 'overhead_ms', 'input_tokens', 'output_tokens', 'dst_port', 'model', 'format', 'upstream_format', 'error']);

function time(record: Row): Date {
  const t = new Date(String(record.event_time ?? ''));
  return Number.isNaN(t.getTime()) ? new Date() : t;
}

/** A row for Postgres: every column present, numbers as numbers, JSON columns as JSON. */
export function postgresRow(table: AuditTable, record: Row): Row {
  const row: Row = {};
  for (const col of COLUMNS[table]) {
    const v = record[col];
    if (col === 'event_time') row[col] = time(record).toISOString();
    else if (col === 'findings' || col === 'inspection_failures') row[col] = Array.isArray(v) ? v : [];
    else if (col === 'attrs') row[col] = v && typeof v === 'object' ? v : {};
    else if (col === 'kind') row[col] = v ?? 'event';
    else if (col === 'decision') row[col] = v ?? 'allow';
    else if (col === 'inspection_failopen' || col === 'identified') row[col] = v === true;
    else if (NUMERIC.has(col)) row[col] = typeof v === 'number' ? v : NULLABLE.has(col) ? null : 0;
    else row[col] = v === undefined || v === null ? (NULLABLE.has(col) ? null : '') : String(v);
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
    } else if (col === 'findings' || col === 'inspection_failures') row[col] = JSON.stringify(v);
    else if (col === 'attrs') {
      const entries = Object.entries(v as Row);
      row.attrs_keys = entries.map(([k]) => k);
      row.attrs_values = entries.map(([, x]) => String(x));
    } else if (col === 'inspection_failopen' || col === 'identified') row[col] = v ? 1 : 0;
    else if (v === null && !NUMERIC.has(col)) row[col] = '';
    else row[col] = v;
  }
  return row;
}
