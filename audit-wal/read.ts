import { AUDIT_RECORD_FIELDS, conditions, type AuditQuery, type AuditRecord, type Condition } from './query.ts';

// Rendering the store-neutral conditions of an audit query as SQL, once per dialect, and turning the
// stores' rows back into AuditRecords. Column names come from the conditions builder only (never from
// a request), and are checked against the table's columns all the same.

export interface LlmQuery {
  org: string;
  agentId: string;
  limit: number;
  offset: number;
}

/** An AuditRecord with the id and the time cursor it was read at (for pagination and the stream). */
export type ReadRecord = AuditRecord & { id: string };

const EVENT_COLUMNS = new Set<string>([...AUDIT_RECORD_FIELDS, 'id', 'kind']);

function column(col: string): string {
  if (!EVENT_COLUMNS.has(col)) throw new Error(`audit query: unknown column ${col}`);
  return col;
}

/** PostgreSQL / PGlite: `$n` parameters. */
export function postgresWhere(q: Pick<AuditQuery, 'predicate' | 'filters' | 'after'>): {
  where: string;
  params: unknown[];
} {
  const params: unknown[] = [];
  const p = (v: unknown) => {
    params.push(v);
    return `$${params.length}`;
  };
  const parts = conditions(q).map((c: Condition) => {
    switch (c.kind) {
      case 'eq':
        return `${column(c.col)} = ${p(c.value)}`;
      case 'in':
        return `${column(c.col)} = ANY(${p(c.values)}::text[])`;
      case 'since':
        return `event_time >= ${p(new Date(c.ms).toISOString())}::timestamptz`;
      case 'until':
        return `event_time <= ${p(new Date(c.ms).toISOString())}::timestamptz`;
      case 'after':
        return `(event_time, id) > (${p(new Date(c.cursor.ms).toISOString())}::timestamptz, ${p(c.cursor.id)})`;
      case 'attributed':
        return `(actor = ${p(`agent:${c.agent}`)} OR agent_id = ${p(c.agent)})`;
      case 'none':
        return 'false';
    }
    return c satisfies never; // every kind is handled above: tsc fails here when one is added
  });
  return { where: parts.length ? parts.join(' AND ') : 'true', params };
}

/** ClickHouse 18.16 has no server-side query parameters: values become escaped literals. */
export function chString(v: string): string {
  return `'${v.replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`;
}

const CH_MS = '(toUInt64(toUnixTimestamp(event_time)) * 1000 + event_time_ms)';

// DateTime holds 1970-01-01 to 2106-02-07 and toDateTime wraps outside it (a 1900 `since` became
// 2042): the bare-column bound is clamped into range; the milliseconds comparison stays exact.
const CH_MAX_SECONDS = 4_294_967_295;

export function clickhouseWhere(q: Pick<AuditQuery, 'predicate' | 'filters' | 'after'>): string {
  const ms = (n: number) => String(Math.trunc(n));
  const seconds = (msValue: number) => ms(Math.min(Math.max(Math.floor(msValue / 1000), 0), CH_MAX_SECONDS));
  const parts = conditions(q).map((c: Condition) => {
    switch (c.kind) {
      case 'eq':
        return `${column(c.col)} = ${chString(c.value)}`;
      case 'in':
        return `${column(c.col)} IN (${c.values.map(chString).join(', ')})`;
      // The bare column first (partition pruning and the sorting key), then the milliseconds.
      case 'since':
        return `event_time >= toDateTime(${seconds(c.ms)}) AND ${CH_MS} >= ${ms(c.ms)}`;
      case 'until':
        return `event_time <= toDateTime(${seconds(c.ms)}) AND ${CH_MS} <= ${ms(c.ms)}`;
      case 'after':
        return `event_time >= toDateTime(${seconds(c.cursor.ms)}) AND (${CH_MS} > ${ms(c.cursor.ms)} OR (${CH_MS} = ${ms(c.cursor.ms)} AND id > ${chString(c.cursor.id)}))`;
      case 'attributed':
        return `(actor = ${chString(`agent:${c.agent}`)} OR agent_id = ${chString(c.agent)})`;
      case 'none':
        return '0';
    }
    return c satisfies never; // every kind is handled above: tsc fails here when one is added
  });
  return parts.length ? parts.join(' AND ') : '1';
}

export const CH_EVENT_SELECT = `id, ${CH_MS} AS ts, ${AUDIT_RECORD_FIELDS.filter((f) => f !== 'attrs' && f !== 'event_time').join(', ')}, attrs_keys, attrs_values`;

// The LLM calls as audit events (AuditQuery.llm, the enclave broker's reads): each llm_audit_log row
// is read as an AuditRecord, in the same (event_time, id) order and under the same conditions as the
// audit_events rows:
//   action "inference.request", actor "agent:<agent_id>" and actor_kind "agent" (both empty when the
//   call named no agent), outcome "deny" for a blocked or denied call, else "allow",
//   resource the request path, reason the error, source "llmproxy", and the call's figures in attrs
//   (LLM_ATTRS, as text; an absent value ''). Its internal `kind` is "llm": a predicate or filter on
//   another kind (a platform operator's "event", network flows) leaves the calls out.

/** The LLM call's fields carried in the record's attrs. */
export const LLM_ATTRS = [
  'format',
  'upstream_format',
  'model',
  'status',
  'upstream_status',
  'decision',
  'latency_ms',
  'request_bytes',
  'response_bytes',
  'input_tokens',
  'output_tokens',
  'findings',
  'inspection_failopen',
  'inspection_failures',
] as const;

/** Each AuditRecord field of an LLM call, per dialect; a field not named here is the empty string. */
const LLM_AS_EVENT: Record<string, { pg: string; ch: string }> = {
  id: { pg: 'id', ch: 'id' },
  kind: { pg: "'llm'::text", ch: "'llm'" },
  action: { pg: "'inference.request'::text", ch: "'inference.request'" },
  actor: {
    pg: "CASE WHEN agent_id = '' THEN '' ELSE 'agent:' || agent_id END",
    ch: "if(agent_id = '', '', concat('agent:', agent_id))",
  },
  actor_kind: {
    pg: "CASE WHEN agent_id = '' THEN '' ELSE 'agent' END",
    ch: "if(agent_id = '', '', 'agent')",
  },
  agent_id: { pg: 'agent_id', ch: 'agent_id' },
  agent_name: { pg: 'agent_name', ch: 'agent_name' },
  org_id: { pg: 'org_id', ch: 'org_id' },
  enclave_id: { pg: 'enclave_id', ch: 'enclave_id' },
  event_time: { pg: 'event_time', ch: 'event_time' },
  outcome: {
    pg: "CASE WHEN decision IN ('block', 'deny') THEN 'deny' ELSE 'allow' END",
    ch: "if(decision IN ('block', 'deny'), 'deny', 'allow')",
  },
  reason: { pg: "coalesce(error, '')", ch: 'error' },
  resource: { pg: 'path', ch: 'path' },
  source: { pg: "'llmproxy'::text", ch: "'llmproxy'" },
  dst_port: { pg: 'NULL::integer', ch: 'CAST(NULL AS Nullable(UInt16))' },
  identified: { pg: 'false', ch: 'toUInt8(0)' },
  attrs: {
    pg: `jsonb_build_object(${LLM_ATTRS.map((a) => `'${a}', coalesce(${a}::text, '')`).join(', ')})`,
    ch: '',
  },
};
const llmField = (f: string, dialect: 'pg' | 'ch') =>
  LLM_AS_EVENT[f]?.[dialect] ?? (dialect === 'pg' ? "''::text" : "''");

/** PostgreSQL: audit_events and the LLM calls as one relation of audit_events' columns (its WHERE goes into both). */
export const PG_EVENTS_WITH_LLM = `(SELECT id, kind, ${AUDIT_RECORD_FIELDS.join(', ')} FROM audit_events UNION ALL SELECT ${[
  'id',
  'kind',
  ...AUDIT_RECORD_FIELDS,
]
  .map((f) => `${llmField(f, 'pg')} AS ${f}`)
  .join(', ')} FROM llm_audit_log) AS events`;

/**
 * ClickHouse: the LLM calls with the columns of CH_EVENT_SELECT (and `kind`), over `table`
 * (its llm_audit_log). Its expressions are aliased with the record's field names, which ClickHouse
 * lets the WHERE of clickhouseWhere() use as they are.
 */
export function chLlmSelect(table: string): string {
  const values = LLM_ATTRS.map((a) =>
    a === 'inspection_failopen' ? "if(inspection_failopen = 1, 'true', 'false')" : `ifNull(toString(${a}), '')`,
  );
  const fields = AUDIT_RECORD_FIELDS.filter((f) => f !== 'attrs' && f !== 'event_time').map((f) => {
    const e = llmField(f, 'ch');
    return e === f ? f : `${e} AS ${f}`;
  });
  return `SELECT id, ${CH_MS} AS ts, ${fields.join(', ')}, [${LLM_ATTRS.map((a) => chString(a)).join(', ')}] AS attrs_keys, [${values.join(', ')}] AS attrs_values, 'llm' AS kind FROM ${table}`;
}

/** A row of either store as a ReadRecord: every AuditRecord field, typed as the spec says. */
export function toRecord(row: Record<string, unknown>): ReadRecord {
  const out: Record<string, unknown> = { id: String(row.id) };
  for (const f of AUDIT_RECORD_FIELDS) out[f] = row[f];
  out.event_time =
    row.ts !== undefined
      ? new Date(Number(row.ts)).toISOString()
      : new Date(row.event_time as string | Date).toISOString();
  if (Array.isArray(row.attrs_keys)) {
    const values = row.attrs_values as string[];
    out.attrs = Object.fromEntries((row.attrs_keys as string[]).map((k, i) => [k, values[i] ?? '']));
  } else {
    out.attrs = Object.fromEntries(
      Object.entries((row.attrs ?? {}) as Record<string, unknown>).map(([k, v]) => [k, String(v)]),
    );
  }
  out.identified = row.identified === true || row.identified === 1;
  out.dst_port = row.dst_port === null || row.dst_port === undefined ? null : Number(row.dst_port);
  return out as ReadRecord;
}

/** An LLM audit entry (`GET /api/v1/agents/{id}/audit-log`). */
export function toLlmEntry(row: Record<string, unknown>): Record<string, unknown> {
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  return {
    id: String(row.id),
    event_time:
      row.ts !== undefined
        ? new Date(Number(row.ts)).toISOString()
        : new Date(row.event_time as string | Date).toISOString(),
    org_id: row.org_id,
    agent_id: row.agent_id,
    agent_name: row.agent_name,
    enclave_id: row.enclave_id,
    action: 'inference.request',
    format: row.format || null,
    upstream_format: row.upstream_format || null,
    path: row.path,
    model: row.model || null,
    status: num(row.status),
    upstream_status: num(row.upstream_status),
    latency_ms: num(row.latency_ms),
    upstream_latency_ms: num(row.upstream_latency_ms),
    overhead_ms: num(row.overhead_ms),
    request_bytes: num(row.request_bytes),
    response_bytes: num(row.response_bytes),
    input_tokens: num(row.input_tokens),
    output_tokens: num(row.output_tokens),
    decision: row.decision,
    outcome: row.decision === 'block' || row.decision === 'deny' ? 'deny' : 'allow',
    findings: typeof row.findings === 'string' ? JSON.parse(row.findings || '[]') : (row.findings ?? []),
    inspection_failopen: row.inspection_failopen === true || row.inspection_failopen === 1,
    inspection_failures:
      typeof row.inspection_failures === 'string'
        ? JSON.parse(row.inspection_failures || '[]')
        : (row.inspection_failures ?? []),
    error: row.error || null,
  };
}
