// Reading the audit trail (operator-api.md: the audit routes, Audit rules 1–3). The caller's scope is
// an AuditPredicate, built by the control plane from the caller's grants and ANDed into every query
// and every stream poll; filters only narrow it. Both stores render the same conditions (conditions()),
// so the predicate is written once and applied identically to ClickHouse and PostgreSQL.

import { AuditQueryError } from './errors.ts';

export const AUDIT_RECORD_FIELDS = [
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
  'event_time',
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
] as const;

export type AuditRecord = Record<(typeof AUDIT_RECORD_FIELDS)[number], unknown>;

/** What a caller may see, whatever it asks for. */
export interface AuditPredicate {
  /** The orgs whose records are visible; 'all' only for a platform operator. */
  orgs: string[] | 'all';
  /** Only records this actor made (a regular member; unattributed records are therefore excluded). */
  actor?: string;
  /** Only records attributed to this agent (an agent-operator): actor `agent:<uid>` or agent_id `<uid>`. */
  agent?: string;
  /** Only these record kinds (a platform operator sees control-plane events, never an enclave's). */
  kinds?: string[];
}

export interface AuditFilters {
  org?: string;
  scope?: string;
  agent_id?: string;
  action?: string;
  outcome?: string;
  actor_kind?: string;
  proto?: string;
  dst_host?: string;
  since?: Date;
  until?: Date;
}

/** A position in (event_time, id) order: the stream's resume cursor. */
export interface AuditCursor {
  ms: number;
  id: string;
}

export interface AuditQuery {
  predicate: AuditPredicate;
  filters: AuditFilters;
  limit: number;
  offset: number;
  after?: AuditCursor;
  /**
   * Also the LLM calls (llm_audit_log), each read as an AuditRecord of action `inference.request`
   * (read.ts, LLM_AS_EVENT): the enclave broker's view of its own store. The control plane reads them
   * per agent only (GET /agents/{id}/audit-log).
   */
  llm?: boolean;
}

export type Condition =
  | { kind: 'eq'; col: string; value: string }
  | { kind: 'in'; col: string; values: string[] }
  | { kind: 'since'; ms: number }
  | { kind: 'until'; ms: number }
  | { kind: 'after'; cursor: AuditCursor }
  | { kind: 'attributed'; agent: string }
  | { kind: 'none' };

export const DEFAULT_LIMIT = 100;
export const MAX_LIMIT = 1000;
/** The spec's known kinds, and `agent`: what an agent did itself (its LLM calls, its network flows). */
export const KNOWN_ACTOR_KINDS = ['human-operator', 'agent-operator', 'service', 'agent'] as const;
export const KNOWN_OUTCOMES = ['allow', 'deny'] as const;

const TEXT_FILTERS = ['org', 'scope', 'agent_id', 'action', 'outcome', 'actor_kind', 'proto', 'dst_host'] as const;
const RFC3339 = /^(\d{4})-(\d\d)-(\d\d)T\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/i;
// The instants both stores can compare against: years 0001–9999 in UTC. PostgreSQL refuses the ISO
// text of year 0 ("0000-…") and of years past 9999 ("+010000-…"); ClickHouse clamps (read.ts).
export const MIN_TIME_MS = -62_135_596_800_000; // 0001-01-01T00:00:00Z
export const MAX_TIME_MS = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z

/** The query parameters of /audit/events and /audit/stream, validated (400 on anything malformed). */
export function parseAuditParams(raw: Record<string, unknown>): {
  filters: AuditFilters;
  limit: number;
  offset: number;
} {
  const known = new Set<string>([...TEXT_FILTERS, 'since', 'until', 'limit', 'offset']);
  for (const k of Object.keys(raw)) if (!known.has(k)) throw new AuditQueryError(k, 'unknown query parameter');
  const one = (k: string): string | undefined => {
    const v = raw[k];
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw new AuditQueryError(k, 'given more than once');
    return v;
  };
  const filters: AuditFilters = {};
  for (const k of TEXT_FILTERS) {
    const v = one(k);
    if (v !== undefined && v !== '') filters[k] = v;
  }
  if (filters.outcome && !(KNOWN_OUTCOMES as readonly string[]).includes(filters.outcome))
    throw new AuditQueryError('outcome', `must be one of ${KNOWN_OUTCOMES.join(', ')}`);
  if (filters.actor_kind && !(KNOWN_ACTOR_KINDS as readonly string[]).includes(filters.actor_kind))
    throw new AuditQueryError('actor_kind', `must be one of ${KNOWN_ACTOR_KINDS.join(', ')}`);
  for (const k of ['since', 'until'] as const) {
    const v = one(k);
    if (v === undefined || v === '') continue;
    const t = new Date(v);
    const m = RFC3339.exec(v);
    // Date rolls "02-30" over into March: the day must exist in its month (RFC 3339 §5.7).
    if (!m || Number.isNaN(t.getTime()) || Number(m[3]) > daysIn(Number(m[1]), Number(m[2]))) {
      throw new AuditQueryError(k, 'must be an RFC 3339 date-time (e.g. 2026-11-22T10:00:00Z)');
    }
    if (t.getTime() < MIN_TIME_MS || t.getTime() > MAX_TIME_MS)
      throw new AuditQueryError(k, 'must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z');
    filters[k] = t;
  }
  if (filters.since && filters.until && filters.since > filters.until)
    throw new AuditQueryError('since', 'is after until');
  const int = (k: string, dflt: number, max: number) => {
    const v = one(k);
    if (v === undefined || v === '') return dflt;
    if (!/^\d{1,9}$/.test(v)) throw new AuditQueryError(k, 'must be a non-negative integer');
    const n = Number(v);
    if (n > max) throw new AuditQueryError(k, `must be at most ${max}`);
    return n;
  };
  const limit = int('limit', DEFAULT_LIMIT, MAX_LIMIT);
  if (limit === 0) throw new AuditQueryError('limit', 'must be at least 1');
  return { filters, limit, offset: int('offset', 0, 1_000_000_000) };
}

/** Every condition of a query: the caller's predicate first (mandatory), then the filters. */
export function conditions(q: Pick<AuditQuery, 'predicate' | 'filters' | 'after'>): Condition[] {
  const out: Condition[] = [];
  const p = q.predicate;
  if (p.orgs !== 'all')
    out.push(p.orgs.length === 0 ? { kind: 'none' } : { kind: 'in', col: 'org_id', values: p.orgs });
  if (p.actor !== undefined) out.push({ kind: 'eq', col: 'actor', value: p.actor });
  if (p.agent !== undefined) out.push({ kind: 'attributed', agent: p.agent });
  if (p.kinds) out.push({ kind: 'in', col: 'kind', values: p.kinds });
  const f = q.filters;
  // `org` narrows only a caller that sees every org (the control plane drops it for everyone else).
  if (f.org !== undefined) out.push({ kind: 'eq', col: 'org_id', value: f.org });
  for (const col of ['scope', 'agent_id', 'action', 'outcome', 'actor_kind'] as const) {
    if (f[col] !== undefined) out.push({ kind: 'eq', col, value: f[col]! });
  }
  // proto and dst_host match network_flow rows only.
  if (f.proto !== undefined || f.dst_host !== undefined) out.push({ kind: 'eq', col: 'kind', value: 'network_flow' });
  if (f.proto !== undefined) out.push({ kind: 'eq', col: 'proto', value: f.proto });
  if (f.dst_host !== undefined) out.push({ kind: 'eq', col: 'dst_host', value: f.dst_host });
  if (f.since) out.push({ kind: 'since', ms: f.since.getTime() });
  if (f.until) out.push({ kind: 'until', ms: f.until.getTime() });
  if (q.after) out.push({ kind: 'after', cursor: q.after });
  return out;
}

export function parseCursor(text: string): AuditCursor | null {
  const m = /^(\d{1,15})\.(.{1,200})$/.exec(text);
  return m && Number(m[1]) <= MAX_TIME_MS ? { ms: Number(m[1]), id: m[2] } : null;
}

const DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
function daysIn(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  return month === 2 && leap ? 29 : (DAYS[month - 1] ?? 0);
}
