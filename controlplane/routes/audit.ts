import { onGrantsChanged } from '../authz/capabilities.ts';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { newId } from '../../core/ids.ts';
import { formatSse, startSseResponse } from '../../core/sse.ts';
import { gated } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { AuditQueryError } from '../../audit-wal/errors.ts';
import { parseAuditParams, parseCursor, MAX_LIMIT, type AuditCursor } from '../../audit-wal/query.ts';
import type { ReadRecord } from '../../audit-wal/read.ts';
import type { AuditStore } from '../../audit-wal/store.ts';
import type { ChangeDeps } from '../audited-change.ts';
import { auditScope, type AuditScope } from '../authz/audit-scope.ts';
import { requireCapability } from '../authz/guard.ts';
import { ANY, arrayOf, INTEGER, pathParams, query, viewSchema } from '../../core/schemas.ts';
import { ApiError, OrgKeyShredded, PROBLEMS } from '../errors.ts';
import { getAgent } from '../store/agents.ts';
import type { ServiceAccountStatus } from '../auth/service-account-status.ts';
import { StreamGuard, type StreamEndReason, type StreamGuardDeps } from '../../core/stream-guard.ts';
import { isSealed, type OrgKeys } from '../crypto/org-keys.ts';

// The audit read API (operator-api.md: the audit routes, Audit rules 1–3, Events "Audit tail"),
// mounted when an audit store is configured (--audit-dsn):
//   GET /api/v1/audit/events   RecordPage {records, next_offset}, (event_time, id) order
//   GET /api/v1/audit/stream   SSE, one AuditRecord per `data`, `id` the resume cursor; Last-Event-ID;
//                              ends with `event: end` when the caller's authorization does (core/stream-guard.ts)
//   GET /api/v1/agents/{id}/audit-log   an agent's LLM audit entries, with findings
// The caller's scope (authz/audit-scope.ts) is ANDed into every query and every poll. A platform
// operator's read of another org writes an audit record into that org's own view, before answering.

export interface AuditReadOptions {
  pollMs: number;
  heartbeatMs: number;
  /** Re-checks the stream's authorization while it runs. */
  guard: StreamGuardDeps;
  /** A disabled service account's stream ends. */
  accountStatus: ServiceAccountStatus;
}

/** How far back each poll of the stream looks for records the store received late (shipping delay). */
const LATE_WINDOW_MS = 10_000;

const strip = ({ id: _id, ...record }: ReadRecord) => record;

/** Audit attributes the control plane writes are sealed under the org's data key (crypto-shred). */
async function sealAttrs(
  keys: OrgKeys | null,
  org: string,
  attrs: Record<string, string>,
): Promise<Record<string, string>> {
  return keys && org ? { sealed: await keys.seal(org, JSON.stringify(attrs)) } : attrs;
}

/** Opens sealed attributes for the reader; after an erasure they read as empty. */
async function openAttrs(keys: OrgKeys | null, record: ReadRecord): Promise<ReadRecord> {
  const attrs = record.attrs as Record<string, string>;
  if (!keys || !isSealed(attrs?.sealed)) return record;
  try {
    return { ...record, attrs: JSON.parse(await keys.open(String(record.org_id), attrs.sealed)) };
  } catch (err) {
    if (err instanceof OrgKeyShredded) return { ...record, attrs: {} };
    throw err;
  }
}

// A record's fields are the audit store's (spec: AuditRecord); served as read, so the schema keeps them all.
const AUDIT_RECORD = { type: 'object', title: 'AuditRecord', additionalProperties: true };
const RECORD_PAGE = viewSchema('RecordPage', { records: arrayOf(AUDIT_RECORD), next_offset: INTEGER });
const LLM_PAGE = viewSchema('llmAuditPage', {
  entries: arrayOf({ type: 'object', title: 'llmAuditEntry', additionalProperties: true }),
  next_offset: INTEGER,
});
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
const AUDIT_QUERY = query(AUDIT_PARAMS, false, ANY);
const LOG_QUERY = query(['limit', 'offset'], false, ANY);

export function auditRoutes(deps: ChangeDeps, store: AuditStore, options: AuditReadOptions) {
  const { db } = deps;
  const streams = new Set<StreamGuard>();

  const params = (req: FastifyRequest) => {
    try {
      return parseAuditParams(req.query as Record<string, unknown>);
    } catch (err) {
      if (err instanceof AuditQueryError) throw new ApiError(PROBLEMS.badRequest, err.message);
      throw err;
    }
  };

  /** Rule 3: each other org a platform operator's read reached gets a record of the read. */
  const recordCrossOrg = async (req: FastifyRequest, scope: AuditScope, orgs: Iterable<string>) => {
    if (!scope.platform) return;
    const p = req.principal!;
    for (const org of new Set(orgs)) {
      if (!org || org === p.orgId) continue;
      const record = {
        id: newId(),
        event_time: new Date().toISOString(),
        kind: 'event',
        action: 'audit.read',
        actor: p.subject,
        actor_kind: p.kind,
        org_id: org,
        outcome: 'allow',
        resource: 'audit',
        scope: `org:${org}`,
        trace_id: String(req.id),
        attrs: await sealAttrs(deps.keys ?? null, org, { route: req.url.split('?')[0], reader_org: p.orgId || '' }),
      };
      try {
        await gated(deps.audit, 'audit_events', record, () => undefined, deps.capture);
      } catch (err) {
        if (err instanceof AuditUnavailableError) throw new ApiError(PROBLEMS.auditUnavailable, err.message);
        throw err;
      }
    }
  };

  // The audit scope is the authorization: auditScope (authz/audit-scope.ts) refuses a caller with no audit
  // grant and is the mandatory predicate of what the others read (spec: Audit rules 1).
  const scoped = (target: string, capability: 'audit:read' | 'audit:read:all') =>
    ({
      requiredCapability: capability,
      authorizedInHandler: "the caller's audit scope (authz/audit-scope.ts)",
      targetLabel: target,
      agentOperator: true,
    }) as const;

  return async (api: FastifyInstance) => {
    api.addHook('preClose', async () => {
      for (const guard of streams) guard.end('shutdown');
      await Promise.all([...streams].map((guard) => guard.settled()));
    });

    api.get(
      '/audit/events',
      {
        config: scoped('caller-org', 'audit:read'),
        schema: { querystring: AUDIT_QUERY, response: { 200: RECORD_PAGE } },
      },
      async (req) => {
        const { filters, limit, offset } = params(req);
        const scope = await auditScope(db, req, filters);
        const rows = await store.readEvents({ predicate: scope.predicate, filters: scope.filters, limit, offset });
        await recordCrossOrg(req, scope, scope.filters.org ? [scope.filters.org] : rows.map((r) => String(r.org_id)));
        const records = [];
        for (const r of rows) records.push(strip(await openAttrs(deps.keys ?? null, r)));
        return { records, next_offset: offset + rows.length };
      },
    );

    api.get(
      '/audit/stream',
      {
        config: { ...scoped('caller-org', 'audit:read'), stream: true },
        schema: { querystring: AUDIT_QUERY, response: { 200: AUDIT_RECORD } },
      },
      async (req, reply) => {
        const { filters } = params(req);
        const scope = await auditScope(db, req, filters);
        const header = req.headers['last-event-id'];
        const resume = Array.isArray(header) ? header[0] : header;
        let cursor: AuditCursor | null = null;
        if (resume) {
          cursor = parseCursor(resume);
          if (!cursor) throw new ApiError(PROBLEMS.badRequest, 'Last-Event-ID: must be an id this stream sent');
        }
        // Without a cursor the tail starts at `since`, or now.
        const startMs = cursor?.ms ?? scope.filters.since?.getTime() ?? Date.now();
        await recordCrossOrg(req, scope, scope.filters.org ? [scope.filters.org] : []);

        reply.hijack();
        const res = reply.raw;
        startSseResponse(res);
        // The scope this stream was opened with must still be the caller's, unchanged, for it to go on.
        const opened = JSON.stringify([scope.predicate, scope.filters, scope.platform]);
        const p = req.principal!;
        const guard = new StreamGuard(
          {
            stream: 'audit',
            res,
            wake: (recheck) => onGrantsChanged(db, recheck),
            expiresAt: typeof p.claims.exp === 'number' ? p.claims.exp * 1000 : null,
            recheck: async (): Promise<StreamEndReason | null> => {
              if (p.kind === 'service' && (await options.accountStatus.disabled(p.subject, true)))
                return 'account_disabled';
              try {
                const now = await auditScope(db, req, filters);
                return JSON.stringify([now.predicate, now.filters, now.platform]) === opened ? null : 'scope_changed';
              } catch (err) {
                if (err instanceof ApiError && err.entry.status === 403) return 'grant_revoked';
                throw err;
              }
            },
          },
          options.guard,
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
            const rows = await store.readEvents({
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
              if (
                !(await guard.write(
                  formatSse(null, strip(await openAttrs(deps.keys ?? null, r)), `${high.ms}.${high.id}`),
                ))
              )
                return;
            }
            if (rows.length < MAX_LIMIT) break;
          }
          if (high) for (const [id, ms] of sent) if (ms < high.ms - LATE_WINDOW_MS) sent.delete(id);
        };
        const heartbeat = setInterval(() => void guard.write(': heartbeat\n\n'), options.heartbeatMs);
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
          await new Promise((r) => setTimeout(r, options.pollMs));
        }
      },
    );

    api.get(
      '/agents/:id/audit-log',
      {
        config: scoped('agent-org', 'audit:read:all'),
        schema: { params: pathParams('id'), querystring: LOG_QUERY, response: { 200: LLM_PAGE } },
      },
      async (req) => {
        const id = (req.params as { id: string }).id;
        const p = req.principal!;
        const { limit, offset } = params(req);
        let org: string;
        if (p.kind === 'agent-operator') {
          // Its own trail only (spec: Agent operators, Reach), under its auditor grant.
          if (p.subject !== `agent:${id}`)
            throw new ApiError(PROBLEMS.forbidden, 'an agent-operator reads its own audit trail only');
          await auditScope(db, req, {});
          org = p.orgId;
        } else {
          org = (await getAgent(db, id))?.org_id ?? p.orgId;
          await requireCapability(db, req, 'audit:read:all', { kind: 'org', org });
        }
        const entries = await store.readLlm({ org, agentId: id, limit, offset });
        return { entries, next_offset: offset + entries.length };
      },
    );
  };
}
