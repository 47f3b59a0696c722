import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { builtInRole, CAPABILITIES } from '../authz/capabilities.ts';
import { requireCapability, type Target } from '../authz/guard.ts';
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
  id: Number(r.id), principal: r.principal, role: r.role, capability: r.capability, scope_kind: r.scope_kind, org_id: r.org_id, group_id: r.group_id, agent_id: r.agent_id,
});

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
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) bad('body', 'must be a JSON object (createGrantReq)');
  const body = raw as Record<string, unknown>;
  for (const k of Object.keys(body)) if (!['principal', 'role', 'capability', 'agent', 'group'].includes(k)) bad(k, 'unknown field');
  const principal = str(body, 'principal');
  if (!principal) bad('principal', 'is required');
  if (!PRINCIPAL.test(principal)) bad('principal', 'must be user:<subject>, group:<org>:<group> or agent:<uid>');
  const role = str(body, 'role');
  const capability = str(body, 'capability');
  if ((role === null) === (capability === null)) bad('role', 'exactly one of role and capability is required');
  if (capability !== null && !(CAPABILITIES as readonly string[]).includes(capability)) bad('capability', `unknown capability (one of ${CAPABILITIES.join(', ')})`);
  if (role !== null && !(await roleExists(db, role))) bad('role', `unknown role "${role}"`);
  const group = str(body, 'group');
  const agent = str(body, 'agent');
  if (target.kind === 'platform') {
    if (group || agent) bad(group ? 'group' : 'agent', 'platform grants are not narrowed to a group or an agent; grant within an org instead');
    if (principal.startsWith('agent:')) bad('principal', 'agent principals are granted within an org');
    return { principal, role, capability, scope_kind: 'platform', org_id: '', group_id: '', agent_id: '' };
  }
  if (group && agent) bad('agent', 'a grant is narrowed to a group or an agent, not both');
  if (role === 'platform-admin') bad('role', 'platform-admin is granted at platform scope (/api/v1/grants)');
  if (principal.startsWith('group:') && principal.split(':')[1] !== target.org) bad('principal', `group principals of org ${target.org} only`);
  if (principal.startsWith('agent:') && (role !== 'auditor' || group || agent)) bad('principal', 'an agent principal may only be granted the auditor role, org-scoped');
  return {
    principal, role, capability,
    scope_kind: group ? 'group' : agent ? 'agent' : 'org',
    org_id: target.org, group_id: group ?? '', agent_id: agent ?? '',
  };
}

/** Where a route's grants live: platform scope, or the org of the path. */
const grantScopeOf = (t: Target) => (t.kind === 'platform' ? { kind: 'platform' as const } : { kind: 'org' as const, org: t.org });

export function grantRoutes(deps: ChangeDeps) {
  const { db } = deps;

  const audited = <T>(req: FastifyRequest, action: string, orgId: string, change: (tx: Queryable) => Promise<{ result: T; resource: string }>) =>
    auditedChange(deps, req, action, orgId, change);

  return async (api: FastifyInstance) => {
    const routes: { prefix: string; capability: 'platform:config' | 'members:*'; target: (req: FastifyRequest) => Target }[] = [
      { prefix: '/grants', capability: 'platform:config', target: () => ({ kind: 'platform' }) },
      { prefix: '/orgs/:org/grants', capability: 'members:*', target: (req) => ({ kind: 'org', org: (req.params as { org: string }).org }) },
    ];
    for (const r of routes) {
      api.get(r.prefix, { config: { requiredCapability: r.capability } }, async (req) => {
        const target = r.target(req);
        await requireCapability(db, req, r.capability, target);
        return (await listGrants(db, grantScopeOf(target))).map(view);
      });

      api.post(r.prefix, { config: { requiredCapability: r.capability } }, async (req, reply) => {
        const target = r.target(req);
        await requireCapability(db, req, r.capability, target);
        const grant = await parseGrant(db, req.body, target);
        await requireConferrable(db, req, await conferredBy(db, grant.role, grant.capability), grantScope(grant), 'this grant');
        const created = await audited(req, 'grant.create', grant.org_id, async (tx) => {
          const row = await insertGrant(tx, grant, req.principal!.subject);
          return { result: view(row), resource: `grant:${row.id}` };
        });
        return reply.code(201).send(created);
      });

      api.delete(`${r.prefix}/:id`, { config: { requiredCapability: r.capability } }, async (req, reply) => {
        const target = r.target(req);
        await requireCapability(db, req, r.capability, target);
        const id = (req.params as { id: string }).id;
        if (!/^\d{1,18}$/.test(id)) throw new ApiError(PROBLEMS.notFound, `no grant ${id}`);
        await audited(req, 'grant.delete', target.kind === 'org' ? target.org : '', async (tx) => {
          if (!(await deleteGrant(tx, grantScopeOf(target), id))) throw new ApiError(PROBLEMS.notFound, `no grant ${id} here`);
          return { result: null, resource: `grant:${id}` };
        });
        return reply.code(204).send();
      });
    }
  };
}
