import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { builtInRole, CAPABILITIES, type ScopeKind } from '../authz/capabilities.ts';
import type { Target } from '../authz/guard.ts';
import { PATH_ORG, PLATFORM } from '../authz/targets.ts';
import { arrayOf, INTEGER, NO_CONTENT, NULLABLE_STRING, object, pathParams, STRING, viewSchema } from './schemas.ts';
import { conferredBy, grantScope, requireConferrable } from '../authz/confer.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { Queryable } from '../../core/sql.ts';

// Grants (spec: createGrantReq, grantView): platform-scope grants under /api/v1/grants (platform:config),
// an org's grants under /api/v1/orgs/{org}/grants (members:* over that org). The body names what is
// granted (principal, a role or a capability, and within an org optionally a group or an agent); who
// may grant is decided by the path, and what it may grant by what it holds: a grant confers only
// capabilities the caller holds over the grant's scope (authz/confer.ts). Every change is audited
// before it is committed.

export interface GrantView {
  id: number;
  principal: string;
  role: string | null;
  capability: string | null;
  scope_kind: ScopeKind;
  org_id: string;
  group_id: string;
  agent_id: string;
}

interface GrantRow extends Omit<GrantView, 'id'> {
  id: string | number;
}

const view = (r: GrantRow): GrantView => ({
  id: Number(r.id), principal: r.principal, role: r.role, capability: r.capability, scope_kind: r.scope_kind, org_id: r.org_id, group_id: r.group_id, agent_id: r.agent_id,
});

const GRANT_VIEW = viewSchema('grantView', {
  id: INTEGER, principal: STRING, role: NULLABLE_STRING, capability: NULLABLE_STRING, scope_kind: STRING,
  org_id: STRING, group_id: STRING, agent_id: STRING,
});
// Empty or null fields are absent (createGrantReq); what they may hold is checked by parseGrant.
const CREATE_GRANT = object(
  {
    principal: NULLABLE_STRING, role: NULLABLE_STRING, capability: NULLABLE_STRING, agent: NULLABLE_STRING,
    group: NULLABLE_STRING,
  },
  [],
  'createGrantReq',
);

const COLUMNS = 'id, principal, role, capability, scope_kind, org_id, group_id, agent_id';
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
  return (await db.query('SELECT 1 FROM roles WHERE name = $1', [role])).rows.length > 0;
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

export function grantRoutes(deps: ChangeDeps) {
  const { db } = deps;

  const audited = <T>(req: FastifyRequest, action: string, orgId: string, change: (tx: Queryable) => Promise<{ result: T; resource: string }>) =>
    auditedChange(deps, req, action, orgId, change);

  return async (api: FastifyInstance) => {
    const routes = [
      { prefix: '/grants', capability: 'platform:config', target: PLATFORM, params: [] as string[] },
      { prefix: '/orgs/:org/grants', capability: 'members:*', target: PATH_ORG, params: ['org'] },
    ] as const;
    for (const r of routes) {
      const scopeSql = (t: Target) => (t.kind === 'platform' ? ["scope_kind = 'platform'", []] : ['org_id = $1', [t.org]]) as [string, string[]];

      const config = { requiredCapability: r.capability, capabilityTarget: r.target };
      const path = r.params.length ? { params: pathParams(...r.params) } : {};
      api.get(r.prefix, { config, schema: { ...path, response: { 200: arrayOf(GRANT_VIEW) } } }, async (req) => {
        const target = await r.target(req);
        const [where, params] = scopeSql(target);
        const { rows } = await db.query<GrantRow>(`SELECT ${COLUMNS} FROM grants WHERE ${where} ORDER BY id`, params);
        return rows.map(view);
      });

      const create = { ...path, body: CREATE_GRANT, response: { 201: GRANT_VIEW } };
      api.post(r.prefix, { config, schema: create }, async (req, reply) => {
        const target = await r.target(req);
        const grant = await parseGrant(db, req.body, target);
        await requireConferrable(db, req, await conferredBy(db, grant.role, grant.capability), grantScope(grant), 'this grant');
        const created = await audited(req, 'grant.create', grant.org_id, async (tx) => {
          const { rows } = await tx.query<GrantRow>(
            `INSERT INTO grants (principal, role, capability, scope_kind, org_id, group_id, agent_id, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ${COLUMNS}`,
            [grant.principal, grant.role, grant.capability, grant.scope_kind, grant.org_id, grant.group_id, grant.agent_id, req.principal!.subject],
          );
          return { result: view(rows[0]), resource: `grant:${rows[0].id}` };
        });
        return reply.code(201).send(created);
      });

      api.delete(`${r.prefix}/:id`, {
        config, schema: { params: pathParams(...r.params, 'id'), response: NO_CONTENT },
      }, async (req, reply) => {
        const target = await r.target(req);
        const id = (req.params as { id: string }).id;
        if (!/^\d{1,18}$/.test(id)) throw new ApiError(PROBLEMS.notFound, `no grant ${id}`);
        const [where, params] = scopeSql(target);
        await audited(req, 'grant.delete', target.kind === 'org' ? target.org : '', async (tx) => {
          const { rows } = await tx.query<{ id: string }>(`DELETE FROM grants WHERE id = $${params.length + 1} AND ${where} RETURNING id`, [...params, id]);
          if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no grant ${id} here`);
          return { result: null, resource: `grant:${id}` };
        });
        return reply.code(204).send();
      });
    }
  };
}
