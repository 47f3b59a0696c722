import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { PLATFORM } from '../authz/targets.ts';
import { BOOLEAN, INTEGER, object, optionalBody, pathParams, STRING, viewSchema } from '../../core/schemas.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { runErasure, type ErasureDeps } from '../erasure.ts';
import { orgExists } from '../store/orgs.ts';
import { getErasure, startErasure, type ErasureRow } from '../store/erasures.ts';

// Per-org erasure (operator-api.md: erasureView, erasureResultView), platform administration:
//   POST /api/v1/orgs/{org}/erasure  → 202 erasureView {org_id, status: "running"} (200 once complete)
//   GET  /api/v1/orgs/{org}/erasure  → 200 erasureResultView {org_id, status, key_shredded, rows_swept}
// The request is audited (at platform scope, so the sweep does not take its own record) before the
// sweep starts; the sweep runs in the background and resumes after a restart.

export function erasureRoutes(deps: ChangeDeps, erasure: ErasureDeps, running: Set<Promise<void>>) {
  const { db } = deps;
  const orgOf = (req: FastifyRequest) => (req.params as { org: string }).org;
  const view = (r: ErasureRow) => ({
    org_id: r.org_id,
    status: r.status,
    key_shredded: r.key_shredded,
    rows_swept: Number(r.rows_swept),
  });

  const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;
  const ERASURE_VIEW = viewSchema('erasureView', { org_id: STRING, status: STRING });
  const RESULT_VIEW = viewSchema('erasureResultView', {
    org_id: STRING,
    status: STRING,
    key_shredded: BOOLEAN,
    rows_swept: INTEGER,
  });

  return async (api: FastifyInstance) => {
    api.post(
      '/orgs/:org/erasure',
      {
        config: platformConfig,
        schema: {
          params: pathParams('org'),
          body: optionalBody(object({})),
          response: { 200: ERASURE_VIEW, 202: ERASURE_VIEW },
        },
      },
      async (req, reply) => {
        const org = orgOf(req);
        const existing = await getErasure(db, org);
        if (existing)
          return reply.code(existing.status === 'complete' ? 200 : 202).send({ org_id: org, status: existing.status });
        if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        await auditedChange(deps, req, 'org.erase', '', async (tx) => {
          await startErasure(tx, org, req.principal!.subject);
          return { result: null, resource: `org:${org}` };
        });
        const job = runErasure(erasure, org).catch((err: Error) =>
          erasure.log.error({ org, err }, 'erasure failed; it resumes at the next start or request'),
        );
        running.add(job);
        void job.finally(() => running.delete(job));
        return reply.code(202).send({ org_id: org, status: 'running' });
      },
    );

    api.get(
      '/orgs/:org/erasure',
      {
        config: platformConfig,
        schema: { params: pathParams('org'), response: { 200: RESULT_VIEW } },
      },
      async (req) => {
        const row = await getErasure(db, orgOf(req));
        if (!row) throw new ApiError(PROBLEMS.notFound, `org ${orgOf(req)} has not been erased`);
        return view(row);
      },
    );
  };
}
