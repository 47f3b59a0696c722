import type { FastifyInstance, FastifyRequest } from 'fastify';
import { coalesced } from '../../../core/coalesce.ts';
import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import {
  arrayOf,
  INTEGER,
  NULLABLE_STRING,
  object,
  optionalBody,
  pathParams,
  query,
  viewSchema,
} from '../../../core/schemas.ts';
import { formatSse, startSseResponse } from '../../../core/sse.ts';
import { StreamGuard, streamGuardDeps } from '../../../core/stream-guard.ts';
import { ApprovalSettledError } from '../../errors.ts';
import type { BrokerDeps } from '../deps.ts';
import { requireCapability } from '../operator/auth.ts';
import { capabilitiesOf, onGrantsChanged, type BrokerCapability } from '../operator/grants.ts';
import { settle, type Outcome } from './settle.ts';
import { eventsAfter, getApproval, latestSeq, listApprovals } from './store.ts';
import { APPROVAL_STATUSES, APPROVAL_VIEW, approvalView, type ApprovalStatus } from './view.ts';

// The approval loop on the operator listener, over the caller's org (the token's), from the enclave's
// own grants (operator/grants.ts): approvals:read to read, approvals:decide to decide.
//   GET  /api/v1/approvals[?status=S&agent=UID&limit=N&offset=M]  → {approvals: [approvalView], next_offset}
//                                                                  newest first; limit 1–500 (100)
//   GET  /api/v1/approvals/{id}                                    → approvalView; 404 (another org's too)
//   POST /api/v1/approvals/{id}/approve  {reason?}                 → approvalView; 409 unless pending
//   POST /api/v1/approvals/{id}/deny     {reason?}                 → approvalView; 409 unless pending
//   GET  /api/v1/approvals/stream                                  SSE: `event: approval`, `id: <seq>`,
//        data approvalView, one per change of the org's approvals after Last-Event-ID (else from now);
//        `: heartbeat` every 15 s; ends (`event: end`) when the caller's grant or token does, or at shutdown
// The capability is checked before the body and the query are.

export const MAX_REASON = 1024;
const MAX_LIMIT = 500;
const DEFAULT_LIMIT = 100;
const MAX_OFFSET = 1_000_000;
const ID = /^[A-Za-z0-9_-]{1,64}$/;
/** A reason: text without control or invisible characters, line breaks and tabs allowed. */
const REASON = /^(?:[^\p{C}]|[\n\t])*$/u;
const HEARTBEAT_MS = 15_000;
/** How often an open feed reads the log without a change announced (a change another broker made). */
const POLL_MS = 2000;
const PAGE = 100;

const DECISION = object({ reason: { ...NULLABLE_STRING, maxLength: MAX_REASON } }, [], 'approvalDecision');
const APPROVAL_PAGE = viewSchema('approvalPage', { approvals: arrayOf(APPROVAL_VIEW), next_offset: INTEGER });
const LIST_QUERY = query(['status', 'agent', 'limit', 'offset'], true);

const bad = (detail: string) => new ApiError(PROBLEMS.badRequest, detail);

function count(raw: string | undefined, name: string, min: number, max: number, fallback: number): number {
  if (raw === undefined) return fallback;
  if (!/^\d{1,7}$/.test(raw) || Number(raw) < min || Number(raw) > max)
    throw bad(`${name}: must be an integer from ${min} to ${max}`);
  return Number(raw);
}

export function approvalOperatorRoutes(deps: BrokerDeps) {
  const { db, options } = deps;
  const guardDeps = streamGuardDeps(deps.registry, deps.log, options.streamRecheckMs, options.idleTimeout, 'broker');
  const org = (req: FastifyRequest) => req.principal!.orgId;
  const gate = (capability: BrokerCapability) => async (req: FastifyRequest) =>
    void (await requireCapability(db, req, capability));
  const notFound = (req: FastifyRequest, id: string) =>
    new ApiError(PROBLEMS.notFound, `no approval ${id} in org ${org(req)}`);
  const idOf = (req: FastifyRequest): string => {
    const id = (req.params as { id: string }).id;
    if (!ID.test(id)) throw notFound(req, id);
    return id;
  };

  return async (api: FastifyInstance) => {
    const streams = new Set<StreamGuard>();
    api.addHook('preClose', async () => {
      for (const guard of streams) guard.end('shutdown');
      await Promise.all([...streams].map((guard) => guard.settled()));
    });

    api.get(
      '/approvals',
      { preValidation: gate('approvals:read'), schema: { querystring: LIST_QUERY, response: { 200: APPROVAL_PAGE } } },
      async (req) => {
        const q = req.query as Record<string, string | undefined>;
        if (q.status !== undefined && !(APPROVAL_STATUSES as readonly string[]).includes(q.status))
          throw bad(`status: must be one of ${APPROVAL_STATUSES.join(', ')}`);
        if (q.agent !== undefined && !/^[^\p{C}\s]{1,200}$/u.test(q.agent)) throw bad('agent: must be an agent id');
        const limit = count(q.limit, 'limit', 1, MAX_LIMIT, DEFAULT_LIMIT);
        const offset = count(q.offset, 'offset', 0, MAX_OFFSET, 0);
        const now = deps.now();
        const rows = await listApprovals(db, {
          org: org(req),
          status: q.status as ApprovalStatus | undefined,
          agent: q.agent,
          limit,
          offset,
          now: new Date(now),
        });
        return { approvals: rows.map((r) => approvalView(r, now)), next_offset: offset + rows.length };
      },
    );

    api.get(
      '/approvals/:id',
      { preValidation: gate('approvals:read'), schema: { params: pathParams('id'), response: { 200: APPROVAL_VIEW } } },
      async (req) => {
        const id = idOf(req);
        const row = await getApproval(db, id);
        if (!row || row.org_id !== org(req)) throw notFound(req, id);
        return approvalView(row, deps.now());
      },
    );

    for (const [verb, outcome] of [
      ['approve', 'approved'],
      ['deny', 'denied'],
    ] as [string, Outcome][])
      api.post(
        `/approvals/:id/${verb}`,
        {
          preValidation: gate('approvals:decide'),
          schema: { params: pathParams('id'), body: optionalBody(DECISION), response: { 200: APPROVAL_VIEW } },
        },
        async (req) => {
          const id = idOf(req);
          const reason = (req.body as { reason?: string | null } | undefined)?.reason ?? null;
          if (reason !== null && !REASON.test(reason))
            throw bad('reason: must not contain control or invisible characters (line breaks and tabs are fine)');
          const p = req.principal!;
          try {
            const view = await settle(
              deps,
              { subject: p.subject, kind: p.kind, traceId: String(req.id) },
              id,
              org(req),
              outcome,
              reason || null,
            );
            if (!view) throw notFound(req, id);
            return view;
          } catch (err) {
            if (err instanceof ApprovalSettledError) throw new ApiError(PROBLEMS.conflict, err.message, { cause: err });
            throw err;
          }
        },
      );

    api.get('/approvals/stream', { preValidation: gate('approvals:read') }, async (req, reply) => {
      const header = req.headers['last-event-id'];
      const resume = Array.isArray(header) ? header[0] : header;
      if (resume !== undefined && resume !== '' && !/^\d{1,15}$/.test(resume))
        throw bad('Last-Event-ID: must be an id this stream sent');
      const latest = await latestSeq(db);
      // An id past the log's end (another store, a log pruned whole) starts from now.
      let cursor = resume ? Math.min(Number(resume), latest) : latest;
      const p = req.principal!;
      const orgId = p.orgId;

      reply.hijack();
      const res = reply.raw;
      startSseResponse(res);
      const exp = p.claims.exp;
      const guard = new StreamGuard(
        {
          stream: 'approvals',
          res,
          wake: (recheck) => onGrantsChanged(db, recheck),
          expiresAt: typeof exp === 'number' ? exp * 1000 : null,
          recheck: async () => ((await capabilitiesOf(db, p)).has('approvals:read') ? null : 'grant_revoked'),
        },
        guardDeps,
      );
      streams.add(guard);
      const send = coalesced(
        async () => {
          let events: Awaited<ReturnType<typeof eventsAfter>>;
          try {
            events = await eventsAfter(db, orgId, cursor, PAGE);
          } catch (err) {
            await guard.write(`: store unavailable (${(err as Error).message.slice(0, 100)}); retrying\n\n`);
            return false;
          }
          for (const e of events) {
            if (!(await guard.write(formatSse('approval', e.view, e.seq)))) return false;
            cursor = e.seq;
          }
          return events.length === PAGE;
        },
        () => guard.stopped,
      );
      const onChange = (c: { orgId: string }) => {
        if (c.orgId === orgId) void send();
      };
      deps.bus.on('approvals', onChange);
      const poll = setInterval(() => void send(), POLL_MS);
      const heartbeat = setInterval(() => void guard.write(': heartbeat\n\n'), HEARTBEAT_MS);
      poll.unref();
      heartbeat.unref();
      res.on('close', () => {
        streams.delete(guard);
        deps.bus.off('approvals', onChange);
        clearInterval(poll);
        clearInterval(heartbeat);
      });
      await send();
    });
  };
}
