import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import {
  arrayOf,
  INTEGER,
  NO_CONTENT,
  NULLABLE_STRING,
  object,
  pathParams,
  STRING,
  viewSchema,
} from '../../../core/schemas.ts';
import { auditedChange } from '../audit.ts';
import type { BrokerDeps } from '../deps.ts';
import { requireCapability } from './auth.ts';
import { brokerRole, deleteGrant, grantsChanged, insertGrant, isBrokerCapability, listGrants } from './grants.ts';

// The enclave's own grants, over the caller's org (members:* in this enclave):
//   GET    /api/v1/grants        → [grantView {id, principal, role, capability, scope_kind: "org", org_id}]
//   POST   /api/v1/grants        {principal, role | capability} → 201 grantView; 409 when identical
//   DELETE /api/v1/grants/{id}   → 204; 404 when the org has no such grant
// Roles: admin (every broker capability), auditor (audit:read, audit:read:all, approvals:read), member
// (audit:read), approver (approvals:read, approvals:decide).
// A caller confers only what it holds. Every change is audited before it is committed.

const GRANT_VIEW = viewSchema('brokerGrantView', {
  id: INTEGER,
  principal: STRING,
  role: NULLABLE_STRING,
  capability: NULLABLE_STRING,
  scope_kind: STRING,
  org_id: STRING,
});
const CREATE = object(
  { principal: STRING, role: NULLABLE_STRING, capability: NULLABLE_STRING },
  ['principal'],
  'brokerGrantReq',
);
const PRINCIPAL = /^(user:[^\s]+|group:[^:\s]+:[^\s]+|agent:[^\s]+)$/;

const view = (g: {
  id: number;
  principal: string;
  role: string | null;
  capability: string | null;
  org_id: string;
}) => ({
  ...g,
  scope_kind: 'org',
});

export function grantRoutes(deps: BrokerDeps) {
  const { db } = deps;
  const org = (req: FastifyRequest) => req.principal!.orgId;
  const actor = (req: FastifyRequest) => ({
    subject: req.principal!.subject,
    kind: req.principal!.kind,
    traceId: String(req.id),
  });
  return async (api: FastifyInstance) => {
    api.get('/grants', { schema: { response: { 200: arrayOf(GRANT_VIEW) } } }, async (req) => {
      await requireCapability(db, req, 'members:*');
      return (await listGrants(db, org(req))).map(view);
    });

    api.post('/grants', { schema: { body: CREATE, response: { 201: GRANT_VIEW } } }, async (req, reply) => {
      const held = await requireCapability(db, req, 'members:*');
      const body = req.body as { principal: string; role?: string | null; capability?: string | null };
      if (!PRINCIPAL.test(body.principal))
        throw new ApiError(
          PROBLEMS.badRequest,
          'principal: must be user:<subject>, group:<org>:<group> or agent:<uid>',
        );
      const role = body.role || null;
      const capability = body.capability || null;
      if ((role === null) === (capability === null))
        throw new ApiError(PROBLEMS.badRequest, 'exactly one of role and capability is required');
      const conferred =
        role !== null ? brokerRole(role) : capability && isBrokerCapability(capability) ? [capability] : undefined;
      if (!conferred)
        throw new ApiError(
          PROBLEMS.badRequest,
          role !== null
            ? `role: unknown role ${JSON.stringify(role)}`
            : `capability: unknown capability ${JSON.stringify(capability)}`,
        );
      const missing = conferred.filter((c) => !held.has(c));
      if (missing.length > 0)
        throw new ApiError(
          PROBLEMS.forbidden,
          `a grant confers only what the caller holds (lacks ${missing.join(', ')})`,
        );
      const grant = await auditedChange(deps, actor(req), 'grant.create', org(req), async (tx) => {
        const g = await insertGrant(tx, { principal: body.principal, role, capability, org: org(req) });
        if (!g) throw new ApiError(PROBLEMS.conflict, 'the same grant exists');
        return {
          result: g,
          resource: `grant:${g.id}`,
          attrs: { principal: g.principal, granted: role ?? capability! },
        };
      });
      grantsChanged(db);
      return reply.code(201).send(view(grant));
    });

    api.delete('/grants/:id', { schema: { params: pathParams('id'), response: NO_CONTENT } }, async (req, reply) => {
      await requireCapability(db, req, 'members:*');
      const raw = (req.params as { id: string }).id;
      if (!/^[1-9]\d{0,15}$/.test(raw)) throw new ApiError(PROBLEMS.notFound, `no grant ${raw} in org ${org(req)}`);
      await auditedChange(deps, actor(req), 'grant.delete', org(req), async (tx) => {
        const g = await deleteGrant(tx, org(req), Number(raw));
        if (!g) throw new ApiError(PROBLEMS.notFound, `no grant ${raw} in org ${org(req)}`);
        return { result: g, resource: `grant:${g.id}` };
      });
      grantsChanged(db);
      return reply.code(204).send();
    });
  };
}
