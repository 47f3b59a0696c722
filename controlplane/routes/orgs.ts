import type { FastifyInstance, FastifyRequest } from 'fastify';
import { requireCapability } from '../authz/guard.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { ApiError, PROBLEMS } from '../errors.ts';

// Orgs and groups (spec: createOrgReq / orgView, createGroupReq / groupView). Creating, listing and
// deleting orgs is platform administration (platform:config); reading and changing one org and its
// groups is org:manage over that org (from the path).

interface OrgView { id: string; kind: string; name: string; provider_org_ref: string; status: string }
interface GroupView { id: string; name: string; org_id: string; provider_group_ref: string }

const ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;
const STATUSES = ['active', 'suspended'];

function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

function object(raw: unknown, allowed: string[]): Record<string, unknown> {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) bad('body', 'must be a JSON object');
  for (const k of Object.keys(raw)) if (!allowed.includes(k)) bad(k, 'unknown field');
  return raw as Record<string, unknown>;
}

function text(body: Record<string, unknown>, field: string, required: boolean): string | undefined {
  const v = body[field];
  if (v === undefined) {
    if (required) bad(field, 'is required');
    return undefined;
  }
  if (typeof v !== 'string') bad(field, 'must be a string');
  if (required && v.trim() === '') bad(field, 'must not be empty');
  return v;
}

const ORG_COLUMNS = 'id, kind, name, provider_org_ref, status';
const GROUP_COLUMNS = 'id, name, org_id, provider_group_ref';

export function orgRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const orgOf = (req: FastifyRequest) => (req.params as { org: string }).org;
  const mustExist = async (org: string) => {
    if ((await db.query('SELECT 1 FROM orgs WHERE id = $1', [org])).rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get('/orgs', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      await requireCapability(db, req, 'platform:config', { kind: 'platform' });
      return (await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs ORDER BY id`)).rows;
    });

    api.post('/orgs', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await requireCapability(db, req, 'platform:config', { kind: 'platform' });
      const body = object(req.body, ['id', 'name', 'provider_org_ref', 'status']);
      const id = text(body, 'id', true)!;
      if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      const name = text(body, 'name', true)!;
      const status = text(body, 'status', false) ?? 'active';
      if (!STATUSES.includes(status)) bad('status', `must be one of ${STATUSES.join(', ')}`);
      const ref = text(body, 'provider_org_ref', false) ?? '';
      // An erased org's id is never reused: its data key is gone for good.
      if ((await db.query('SELECT 1 FROM erasures WHERE org_id = $1', [id])).rows.length > 0) throw new ApiError(PROBLEMS.conflict, `org ${id} was erased; its id is not reused`);
      const org = await auditedChange(deps, req, 'org.create', id, async (tx) => {
        const { rows } = await tx.query<OrgView>(
          `INSERT INTO orgs (id, name, provider_org_ref, status, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING ${ORG_COLUMNS}`,
          [id, name, ref, status, req.principal!.subject],
        );
        return { result: rows[0], resource: `org:${id}` };
      });
      return reply.code(201).send(org);
    });

    api.get('/orgs/:org', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      await requireCapability(db, req, 'org:manage', { kind: 'org', org: orgOf(req) });
      const { rows } = await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs WHERE id = $1`, [orgOf(req)]);
      if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${orgOf(req)}`);
      return rows[0];
    });

    api.put('/orgs/:org', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      const org = orgOf(req);
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      const body = object(req.body, ['name', 'provider_org_ref', 'status']);
      const name = text(body, 'name', false);
      const ref = text(body, 'provider_org_ref', false);
      const status = text(body, 'status', false);
      if (status !== undefined && !STATUSES.includes(status)) bad('status', `must be one of ${STATUSES.join(', ')}`);
      if (name !== undefined && name.trim() === '') bad('name', 'must not be empty');
      return auditedChange(deps, req, 'org.update', org, async (tx) => {
        const { rows } = await tx.query<OrgView>(
          `UPDATE orgs SET name = coalesce($2, name), provider_org_ref = coalesce($3, provider_org_ref), status = coalesce($4, status) WHERE id = $1 RETURNING ${ORG_COLUMNS}`,
          [org, name ?? null, ref ?? null, status ?? null],
        );
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        return { result: rows[0], resource: `org:${org}` };
      });
    });

    api.delete('/orgs/:org', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await requireCapability(db, req, 'platform:config', { kind: 'platform' });
      const org = orgOf(req);
      await auditedChange(deps, req, 'org.delete', org, async (tx) => {
        const { rows } = await tx.query('DELETE FROM orgs WHERE id = $1 RETURNING id', [org]);
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        await tx.query('DELETE FROM grants WHERE org_id = $1', [org]);
        await tx.query('DELETE FROM memberships WHERE org_id = $1', [org]);
        return { result: null, resource: `org:${org}` };
      });
      return reply.code(204).send();
    });

    api.get('/orgs/:org/groups', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      const org = orgOf(req);
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      await mustExist(org);
      return (await db.query<GroupView>(`SELECT ${GROUP_COLUMNS} FROM org_groups WHERE org_id = $1 ORDER BY id`, [org])).rows;
    });

    api.post('/orgs/:org/groups', { config: { requiredCapability: 'org:manage' } }, async (req, reply) => {
      const org = orgOf(req);
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      await mustExist(org);
      const body = object(req.body, ['id', 'name', 'provider_group_ref']);
      const id = text(body, 'id', true)!;
      if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      const name = text(body, 'name', true)!;
      const ref = text(body, 'provider_group_ref', false) ?? '';
      const group = await auditedChange(deps, req, 'group.create', org, async (tx) => {
        const { rows } = await tx.query<GroupView>(
          `INSERT INTO org_groups (org_id, id, name, provider_group_ref, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING ${GROUP_COLUMNS}`,
          [org, id, name, ref, req.principal!.subject],
        );
        return { result: rows[0], resource: `group:${org}:${id}` };
      });
      return reply.code(201).send(group);
    });

    api.delete('/orgs/:org/groups/:group', { config: { requiredCapability: 'org:manage' } }, async (req, reply) => {
      const org = orgOf(req);
      const group = (req.params as { group: string }).group;
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      await auditedChange(deps, req, 'group.delete', org, async (tx) => {
        const { rows } = await tx.query('DELETE FROM org_groups WHERE org_id = $1 AND id = $2 RETURNING id', [org, group]);
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no group ${group} in org ${org}`);
        await tx.query('DELETE FROM grants WHERE principal = $1 OR (org_id = $2 AND group_id = $3)', [`group:${org}:${group}`, org, group]);
        await tx.query('DELETE FROM memberships WHERE org_id = $1 AND group_id = $2', [org, group]);
        return { result: null, resource: `group:${org}:${group}` };
      });
      return reply.code(204).send();
    });
  };
}
