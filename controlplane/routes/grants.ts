import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { builtInRole, CAPABILITIES } from '../authz/capabilities.ts';
import type { Target } from '../authz/guard.ts';
import { PATH_ORG, PLATFORM } from '../authz/targets.ts';
import {
  arrayOf,
  INTEGER,
  NO_CONTENT,
  NULLABLE_STRING,
  object,
  pathParams,
  STRING,
  viewSchema,
} from '../../core/schemas.ts';
import { conferredBy, grantScope, requireConferrable } from '../authz/confer.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { Queryable } from '../../core/sql.ts';
import { customRoleExists } from '../store/roles.ts';
import { deleteGrant, insertGrant, listGrants, type GrantRow } from '../store/grants.ts';

// Grants (spec: createGrantReq, grantView): platform-scope grants under /api/v1/grants (platform:config),
// an org's grants under /api/v1/orgs/{org}/grants (members:* over that org). The body names what is
// granted (principal, a role or a capability, and within an org optionally a group or an agent); who
// may grant is decided by the path, and what it may grant by what it holds: a grant confers only
// capabilities the caller holds over the grant's scope (authz/confer.ts). Every change is audited
// before it is committed.

export type GrantView = Omit<GrantRow, 'id'> & { id: number };

const view = (r: GrantRow): GrantView => ({
  id: Number(r.id),
  principal: r.principal,
  role: r.role,
  capability: r.capability,
  scope_kind: r.scope_kind,
  org_id: r.org_id,
  group_id: r.group_id,
  agent_id: r.agent_id,
});

const GRANT_VIEW = viewSchema('grantView', {
  id: INTEGER,
  principal: STRING,
  role: NULLABLE_STRING,
  capability: NULLABLE_STRING,
  scope_kind: STRING,
  org_id: STRING,
  group_id: STRING,
  agent_id: STRING,
});
// Empty or null fields are absent (createGrantReq); what they may hold is checked by parseGrant.
const CREATE_GRANT = object(
  {
    principal: NULLABLE_STRING,
    role: NULLABLE_STRING,
    capability: NULLABLE_STRING,
    agent: NULLABLE_STRING,
    group: NULLABLE_STRING,
  },
  [],
  'createGrantReq',
);
const PRINCIPAL = /^(user:.+|group:[^:]+:.+|agent:.+)$/;

function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

function str(body: Record<string, unknown>, field: string): string | null {
  const v = body[field];
  if (v === undefined || v === null || v === '') return null;
  if (typeof v !== 'string') bad(field, 'must be a string');
  return v;
}

async function roleExists(db: Queryable, role: string): Promise<boolean> {
  if (builtInRole(role)) return true;
  return customRoleExists(db, role);
}

/** Validates createGrantReq for a scope the path fixed; returns the row to insert. */
async function parseGrant(db: Queryable, raw: unknown, target: Target): Promise<Omit<GrantView, 'id'>> {
  const body = raw as Record<string, unknown>;
  const principal = str(body, 'principal');
  if (!principal) bad('principal', 'is required');
  if (!PRINCIPAL.test(principal)) bad('principal', 'must be user:<subject>, group:<org>:<group> or agent:<uid>');
  const role = str(body, 'role');
  const capability = str(body, 'capability');
  if ((role === null) === (capability === null)) bad('role', 'exactly one of role and capability is required');
  if (capability !== null && !(CAPABILITIES as readonly string[]).includes(capability))
    bad('capability', `unknown capability (one of ${CAPABILITIES.join(', ')})`);
  if (role !== null && !(await roleExists(db, role))) bad('role', `unknown role "${role}"`);
  const group = str(body, 'group');
  const agent = str(body, 'agent');
  if (target.kind === 'platform') {
    if (group || agent)
      bad(
        group ? 'group' : 'agent',
        'platform grants are not narrowed to a group or an agent; grant within an org instead',
      );
    if (principal.startsWith('agent:')) bad('principal', 'agent principals are granted within an org');
    return { principal, role, capability, scope_kind: 'platform', org_id: '', group_id: '', agent_id: '' };
  }
  if (group && agent) bad('agent', 'a grant is narrowed to a group or an agent, not both');
  if (role === 'platform-admin') bad('role', 'platform-admin is granted at platform scope (/api/v1/grants)');
  if (principal.startsWith('group:') && principal.split(':')[1] !== target.org)
    bad('principal', `group principals of org ${target.org} only`);
  if (principal.startsWith('agent:') && (role !== 'auditor' || group || agent))
    bad('principal', 'an agent principal may only be granted the auditor role, org-scoped');
  return {
    principal,
    role,
    capability,
    scope_kind: group ? 'group' : agent ? 'agent' : 'org',
    org_id: target.org,
    group_id: group ?? '',
    agent_id: agent ?? '',
  };
}

/** Where a route's grants live: platform scope, or the org of the path. */
const grantScopeOf = (t: Target) =>
  t.kind === 'platform' ? { kind: 'platform' as const } : { kind: 'org' as const, org: t.org };

export function grantRoutes(deps: ChangeDeps) {
  const { db } = deps;

  const audited = <T>(
    req: FastifyRequest,
    action: string,
    orgId: string,
    change: (tx: Queryable) => Promise<{ result: T; resource: string }>,
  ) => auditedChange(deps, req, action, orgId, change);

  return async (api: FastifyInstance) => {
    const routes = [
      { prefix: '/grants', capability: 'platform:config', target: PLATFORM, params: [] as string[] },
      { prefix: '/orgs/:org/grants', capability: 'members:*', target: PATH_ORG, params: ['org'] },
    ] as const;
    for (const r of routes) {
      const config = { requiredCapability: r.capability, capabilityTarget: r.target };
      const path = r.params.length ? { params: pathParams(...r.params) } : {};
      api.get(r.prefix, { config, schema: { ...path, response: { 200: arrayOf(GRANT_VIEW) } } }, async (req) => {
        const target = await r.target(req);
        return (await listGrants(db, grantScopeOf(target))).map(view);
      });

      const create = { ...path, body: CREATE_GRANT, response: { 201: GRANT_VIEW } };
      api.post(r.prefix, { config, schema: create }, async (req, reply) => {
        const target = await r.target(req);
        const grant = await parseGrant(db, req.body, target);
        await requireConferrable(
          db,
          req,
          await conferredBy(db, grant.role, grant.capability),
          grantScope(grant),
          'this grant',
        );
        const created = await audited(req, 'grant.create', grant.org_id, async (tx) => {
          const row = await insertGrant(tx, grant, req.principal!.subject);
          return { result: view(row), resource: `grant:${row.id}` };
        });
        return reply.code(201).send(created);
      });

      api.delete(
        `${r.prefix}/:id`,
        {
          config,
          schema: { params: pathParams(...r.params, 'id'), response: NO_CONTENT },
        },
        async (req, reply) => {
          const target = await r.target(req);
          const id = (req.params as { id: string }).id;
          if (!/^\d{1,18}$/.test(id)) throw new ApiError(PROBLEMS.notFound, `no grant ${id}`);
          await audited(req, 'grant.delete', target.kind === 'org' ? target.org : '', async (tx) => {
            if (!(await deleteGrant(tx, grantScopeOf(target), id)))
              throw new ApiError(PROBLEMS.notFound, `no grant ${id} here`);
            return { result: null, resource: `grant:${id}` };
          });
          return reply.code(204).send();
        },
      );
    }
  };
}
