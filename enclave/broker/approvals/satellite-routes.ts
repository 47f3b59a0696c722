import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import { INTEGER, NULLABLE_STRING, object, optionalBody, pathParams, query } from '../../../core/schemas.ts';
import { ApprovalLimitError, ApprovalSettledError } from '../../errors.ts';
import type { BrokerDeps } from '../deps.ts';
import { createApproval, type ApprovalRequest } from './create.ts';
import { settle } from './settle.ts';
import { getApproval } from './store.ts';
import { APPROVAL_VIEW, approvalView } from './view.ts';
import { MAX_WAIT_SECONDS, type ApprovalWaits } from './waits.ts';

// The approvals API llmproxy calls (behind the satellite token: registered inside satellite-routes.ts,
// whose hook authenticates every /v1/satellite path). The satellite acts for every org of the enclave.
//
//   POST /v1/satellite/approvals              approvalRequest → 201 approvalView; 429 `approval rate
//                                             limit exceeded` past a limit; 404 for an agent this enclave
//                                             does not run in org_id; 403 for a suspended, isolated or
//                                             contained one; 409 when the same call was sent with other
//                                             arguments or another policy version
//   GET  /v1/satellite/approvals/{id}?wait=S  → 200 approvalView, once it is no longer pending or after
//                                             S seconds (0–30; default 0: at once); 404 for no such id
//   POST /v1/satellite/approvals/{id}/cancel  → 200 approvalView (cancelled; again for one already
//                                             cancelled); 409 once approved, denied or expired

/** Ids, names and versions: visible characters only (no whitespace, controls or invisible format characters). */
const VISIBLE = /^[^\p{C}\s]+$/u;
/** Human text shown to the approver (a rule's summary, a model or agent name): no control or invisible characters. */
const PLAIN_TEXT = /^[^\p{C}]*$/u;
export const MAX_ARGUMENTS_BYTES = 16 * 1024;
const MIN_EXPIRY_MS = 1000;
const MAX_EXPIRY_MS = 24 * 3600_000;
const ID = /^[A-Za-z0-9_-]{1,64}$/;

const str = (max: number, min = 1) => ({ type: 'string', minLength: min, maxLength: max });
export const APPROVAL_REQUEST = object(
  {
    request_id: str(256),
    call_id: str(256),
    org_id: str(200),
    agent_id: str(200),
    agent_name: str(256, 0),
    model: str(256, 0),
    tool: str(256),
    arguments: { type: 'string', maxLength: MAX_ARGUMENTS_BYTES },
    args_digest: { type: 'string', pattern: '^[0-9a-f]{64}$', 'x-error': 'must be 64 lowercase hex digits (SHA-256)' },
    rule: str(256),
    summary: { ...NULLABLE_STRING, maxLength: 1024 },
    policy_version: {
      type: 'string',
      pattern: '^[0-9a-f]{16,64}$',
      'x-error': 'must be 16 to 64 lowercase hex digits',
    },
    expires_in_ms: {
      ...INTEGER,
      minimum: MIN_EXPIRY_MS,
      maximum: MAX_EXPIRY_MS,
      'x-error': 'must be an integer from 1000 to 86400000',
    },
  },
  [
    'request_id',
    'call_id',
    'org_id',
    'agent_id',
    'agent_name',
    'model',
    'tool',
    'arguments',
    'args_digest',
    'rule',
    'policy_version',
    'expires_in_ms',
  ],
  'approvalRequest',
);

const bad = (detail: string) => new ApiError(PROBLEMS.badRequest, detail);

/** The fields the schema cannot say: visible identifiers, plain text, the arguments' size in bytes. */
function checked(body: ApprovalRequest & { summary?: string | null }): ApprovalRequest {
  for (const k of ['request_id', 'call_id', 'org_id', 'agent_id', 'tool', 'rule'] as const)
    if (!VISIBLE.test(body[k])) throw bad(`${k}: must be visible characters without whitespace`);
  for (const k of ['agent_name', 'model', 'summary'] as const)
    if (!PLAIN_TEXT.test(body[k] ?? '')) throw bad(`${k}: must not contain control or invisible characters`);
  if (Buffer.byteLength(body.arguments, 'utf8') > MAX_ARGUMENTS_BYTES)
    throw bad(`arguments: must be at most ${MAX_ARGUMENTS_BYTES} bytes`);
  return { ...body, summary: body.summary ?? '' };
}

/** ?wait: seconds, 0 to 30 (a decimal is fine). */
function waitMs(raw: unknown): number {
  if (raw === undefined) return 0;
  if (typeof raw !== 'string' || !/^\d{1,2}(\.\d{1,3})?$/.test(raw) || Number(raw) > MAX_WAIT_SECONDS)
    throw bad(`wait: must be a number of seconds from 0 to ${MAX_WAIT_SECONDS}`);
  return Math.round(Number(raw) * 1000);
}

const SATELLITE = { subject: 'satellite', kind: 'service' };

export function approvalSatelliteRoutes(deps: BrokerDeps, waits: ApprovalWaits) {
  const idOf = (req: FastifyRequest): string => {
    const id = (req.params as { id: string }).id;
    if (!ID.test(id)) throw new ApiError(PROBLEMS.notFound, `no approval ${id}`);
    return id;
  };
  const actor = (req: FastifyRequest) => ({ ...SATELLITE, traceId: String(req.id) });

  return async (app: FastifyInstance) => {
    app.addHook('preClose', async () => waits.close());

    app.post(
      '/v1/satellite/approvals',
      // 16 KiB of arguments may take six times that as JSON text inside JSON (every character escaped).
      {
        bodyLimit: 6 * MAX_ARGUMENTS_BYTES + 8192,
        schema: { body: APPROVAL_REQUEST, response: { 201: APPROVAL_VIEW } },
      },
      async (req, reply) => {
        const request = checked(req.body as ApprovalRequest);
        try {
          return reply.code(201).send(await createApproval(deps, actor(req), request));
        } catch (err) {
          if (err instanceof ApprovalLimitError)
            throw new ApiError(PROBLEMS.tooManyRequests, err.message, { cause: err });
          throw err;
        }
      },
    );

    app.get(
      '/v1/satellite/approvals/:id',
      { schema: { params: pathParams('id'), querystring: query(['wait'], true), response: { 200: APPROVAL_VIEW } } },
      async (req, reply) => {
        const id = idOf(req);
        const ms = waitMs((req.query as { wait?: unknown }).wait);
        // The response closes before it was sent: the caller left, and its wait ends.
        const gone = new AbortController();
        const left = () => gone.abort();
        reply.raw.once('close', left);
        try {
          const view = ms > 0 ? await waits.wait(id, ms, gone.signal) : await read(id);
          if (!view) throw new ApiError(PROBLEMS.notFound, `no approval ${id}`);
          return view;
        } finally {
          reply.raw.off('close', left);
        }
      },
    );

    app.post(
      '/v1/satellite/approvals/:id/cancel',
      { schema: { params: pathParams('id'), body: optionalBody(object({})), response: { 200: APPROVAL_VIEW } } },
      async (req) => {
        const id = idOf(req);
        try {
          const view = await settle(deps, actor(req), id, null, 'cancelled', null);
          if (!view) throw new ApiError(PROBLEMS.notFound, `no approval ${id}`);
          return view;
        } catch (err) {
          if (!(err instanceof ApprovalSettledError)) throw err;
          // Cancelled already: the same answer again (llmproxy may send it twice).
          if (err.status === 'cancelled') return (await read(id))!;
          throw new ApiError(PROBLEMS.conflict, err.message, { cause: err });
        }
      },
    );
  };

  async function read(id: string) {
    const row = await getApproval(deps.db, id);
    return row && approvalView(row, deps.now());
  }
}
