import type { FastifyContextConfig, FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../core/errors.ts';
import { PROBLEMS } from '../core/problem.ts';
import { ANY, arrayOf, INTEGER, query, viewSchema } from '../core/schemas.ts';
import { formatSse, startSseResponse } from '../core/sse.ts';
import { StreamGuard, type StreamEndReason, type StreamGuardDeps } from '../core/stream-guard.ts';
import { AuditQueryError } from './errors.ts';
import { MAX_LIMIT, parseAuditParams, parseCursor, type AuditCursor, type AuditFilters } from './query.ts';
import type { ReadRecord } from './read.ts';
import type { AuditScope } from './scope.ts';
import type { AuditStore } from './store.ts';

// The audit read routes (operator-api.md: the audit routes, Audit rules 1–2, Events "Audit tail"), one
// implementation for every plane that serves them over an audit store (the control plane, the enclave
// broker). A plane says who may read what (`scopeOf`, its grants handed to the persona rule of
// scope.ts) and what happens around a read; the routes are the same:
//   GET /audit/events   RecordPage {records, next_offset}, (event_time, id) order
//   GET /audit/stream   SSE, one AuditRecord per `data`, `id` the resume cursor; Last-Event-ID;
//                       ends with `event: end` when the caller's authorization does (core/stream-guard.ts)
// The caller's scope is ANDed into every query and every poll (Audit rules 1).

export interface AuditReadRoutes {
  store: AuditStore;
  /**
   * The caller's audit scope for these filters: the mandatory predicate of what it reads. Throws
   * ApiError 403 when the caller holds no audit grant (401 when unauthenticated).
   */
  scopeOf(req: FastifyRequest, filters: AuditFilters): Promise<AuditScope>;
  /**
   * Before a read is answered: the orgs whose records it reached (the stream: the org it narrowed to).
   * The control plane records a platform operator's read of another org there (Audit rules 3).
   */
  onRead?(req: FastifyRequest, scope: AuditScope, orgs: string[]): Promise<void>;
  /** Each record before it is served (the control plane opens attributes sealed under an org's key). */
  openRecord?(record: ReadRecord): Promise<ReadRecord>;
  /** Subscribes a stream's re-check to the plane's grant changes; returns the unsubscribe. */
  wake?(recheck: () => void): () => void;
  /** Another reason an open stream ends, besides its scope (the control plane: a disabled service account). */
  streamRecheck?(req: FastifyRequest): Promise<StreamEndReason | null>;
  /** Also the LLM calls (llm_audit_log) as AuditRecords of action inference.request (AuditQuery.llm). */
  llm?: boolean;
  /** How often the stream asks the store for new records. */
  pollMs: number;
  heartbeatMs: number;
  /** Re-checks the stream's authorization while it runs. */
  guard: StreamGuardDeps;
  /** Each route's config (the control plane declares its capability check there, for its hook and document). */
  config?: { events?: FastifyContextConfig; stream?: FastifyContextConfig };
}

/** How far back each poll of the stream looks for records the store received late (shipping delay). */
export const LATE_WINDOW_MS = 10_000;

const strip = ({ id: _id, ...record }: ReadRecord) => record;

// A record's fields are the audit store's (spec: AuditRecord); served as read, so the schema keeps them all.
export const AUDIT_RECORD = { type: 'object', title: 'AuditRecord', additionalProperties: true };
export const RECORD_PAGE = viewSchema('RecordPage', { records: arrayOf(AUDIT_RECORD), next_offset: INTEGER });
// Strings; repeated or unknown parameters are refused by parseAuditParams (its messages name the parameter).
const AUDIT_PARAMS = [
  'org',
  'scope',
  'agent_id',
  'action',
  'outcome',
  'actor_kind',
  'proto',
  'dst_host',
  'since',
  'until',
  'limit',
  'offset',
];
export const AUDIT_QUERY = query(AUDIT_PARAMS, false, ANY);

/** The request's audit parameters, or 400 naming the malformed one. */
export function auditParams(req: FastifyRequest): ReturnType<typeof parseAuditParams> {
  try {
    return parseAuditParams(req.query as Record<string, unknown>);
  } catch (err) {
    if (err instanceof AuditQueryError) throw new ApiError(PROBLEMS.badRequest, err.message);
    throw err;
  }
}

/** The audit read routes, added to `api` (mount it under the plane's /api/v1). */
export function auditReadRoutes(o: AuditReadRoutes) {
  const { store } = o;
  const streams = new Set<StreamGuard>();
  const open = async (r: ReadRecord) => strip(o.openRecord ? await o.openRecord(r) : r);
  const read = (q: Omit<Parameters<AuditStore['readEvents']>[0], 'llm'>) =>
    store.readEvents(o.llm ? { ...q, llm: true } : q);

  return async (api: FastifyInstance) => {
    api.addHook('preClose', async () => {
      for (const guard of streams) guard.end('shutdown');
      await Promise.all([...streams].map((guard) => guard.settled()));
    });

    api.get(
      '/audit/events',
      {
        ...(o.config?.events ? { config: o.config.events } : {}),
        schema: { querystring: AUDIT_QUERY, response: { 200: RECORD_PAGE } },
      },
      async (req) => {
        const { filters, limit, offset } = auditParams(req);
        const scope = await o.scopeOf(req, filters);
        const rows = await read({ predicate: scope.predicate, filters: scope.filters, limit, offset });
        await o.onRead?.(req, scope, scope.filters.org ? [scope.filters.org] : rows.map((r) => String(r.org_id)));
        const records = [];
        for (const r of rows) records.push(await open(r));
        return { records, next_offset: offset + rows.length };
      },
    );

    api.get(
      '/audit/stream',
      {
        ...(o.config?.stream ? { config: o.config.stream } : {}),
        schema: { querystring: AUDIT_QUERY, response: { 200: AUDIT_RECORD } },
      },
      async (req, reply) => {
        const { filters } = auditParams(req);
        const scope = await o.scopeOf(req, filters);
        const header = req.headers['last-event-id'];
        const resume = Array.isArray(header) ? header[0] : header;
        let cursor: AuditCursor | null = null;
        if (resume) {
          cursor = parseCursor(resume);
          if (!cursor) throw new ApiError(PROBLEMS.badRequest, 'Last-Event-ID: must be an id this stream sent');
        }
        // Without a cursor the tail starts at `since`, or now.
        const startMs = cursor?.ms ?? scope.filters.since?.getTime() ?? Date.now();
        await o.onRead?.(req, scope, scope.filters.org ? [scope.filters.org] : []);

        reply.hijack();
        const res = reply.raw;
        startSseResponse(res);
        // The scope this stream was opened with must still be the caller's, unchanged, for it to go on.
        const opened = JSON.stringify([scope.predicate, scope.filters, scope.platform]);
        const p = req.principal;
        const exp = p?.claims.exp;
        const guard = new StreamGuard(
          {
            stream: 'audit',
            res,
            ...(o.wake ? { wake: o.wake } : {}),
            expiresAt: typeof exp === 'number' ? exp * 1000 : null,
            recheck: async (): Promise<StreamEndReason | null> => {
              const other = await o.streamRecheck?.(req);
              if (other) return other;
              try {
                const now = await o.scopeOf(req, filters);
                return JSON.stringify([now.predicate, now.filters, now.platform]) === opened ? null : 'scope_changed';
              } catch (err) {
                if (err instanceof ApiError && err.entry.status === 403) return 'grant_revoked';
                throw err;
              }
            },
          },
          o.guard,
        );
        streams.add(guard);
        let closed = false;
        // Nothing is written once the client left or the guard ended the stream (its `end` is the last
        // event); each write waits for the client to take it (a client that does not read ends the stream).
        const live = () => !closed && !guard.stopped;
        // Records already sent within the late window (the store may receive a record after a later one).
        const sent = new Map<string, number>();
        let high: AuditCursor | null = cursor;
        const isAfter = (r: ReadRecord, c: AuditCursor) => {
          const ms = new Date(String(r.event_time)).getTime();
          return ms > c.ms || (ms === c.ms && r.id > c.id);
        };
        const poll = async () => {
          const floor = (high?.ms ?? startMs) - LATE_WINDOW_MS;
          for (let offset = 0; live(); offset += MAX_LIMIT) {
            const rows = await read({
              predicate: scope.predicate,
              filters: { ...scope.filters, since: new Date(Math.max(floor, scope.filters.since?.getTime() ?? 0)) },
              limit: MAX_LIMIT,
              offset,
            });
            for (const r of rows) {
              if (!live()) return;
              if (sent.has(r.id) || (cursor && !isAfter(r, cursor))) continue;
              const ms = new Date(String(r.event_time)).getTime();
              if (!cursor && ms < startMs) continue;
              sent.set(r.id, ms);
              if (!high || isAfter(r, high)) high = { ms, id: r.id };
              if (!(await guard.write(formatSse(null, await open(r), `${high.ms}.${high.id}`)))) return;
            }
            if (rows.length < MAX_LIMIT) break;
          }
          if (high) for (const [id, ms] of sent) if (ms < high.ms - LATE_WINDOW_MS) sent.delete(id);
        };
        const heartbeat = setInterval(() => void guard.write(': heartbeat\n\n'), o.heartbeatMs);
        res.on('close', () => {
          closed = true;
          streams.delete(guard);
          clearInterval(heartbeat);
        });
        while (live()) {
          try {
            await poll();
          } catch (err) {
            await guard.write(`: store unavailable (${(err as Error).message.slice(0, 100)}); retrying\n\n`);
          }
          await new Promise((r) => setTimeout(r, o.pollMs));
        }
      },
    );
  };
}
