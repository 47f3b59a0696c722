import type { FastifyInstance, FastifyRequest } from 'fastify';
import { requireCapability } from '../authz/guard.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { deleteOrg, getOrg, insertOrg, listOrgs, orgExists, orgWasErased, updateOrg } from '../store/orgs.ts';
import { deleteGroup, insertGroup, listGroups } from '../store/groups.ts';

// Orgs and groups (spec: createOrgReq / orgView, createGroupReq / groupView). Creating, listing and
// deleting orgs is platform administration (platform:config); reading and changing one org and its
// groups is org:manage over that org (from the path).

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

export function orgRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const orgOf = (req: FastifyRequest) => (req.params as { org: string }).org;
  const mustExist = async (org: string) => {
    if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get('/orgs', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      await requireCapability(db, req, 'platform:config', { kind: 'platform' });
      return listOrgs(db);
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
      if (await orgWasErased(db, id)) throw new ApiError(PROBLEMS.conflict, `org ${id} was erased; its id is not reused`);
      const org = await auditedChange(deps, req, 'org.create', id, async (tx) => {
        return { result: await insertOrg(tx, { id, name, ref, status }, req.principal!.subject), resource: `org:${id}` };
      });
      return reply.code(201).send(org);
    });

    api.get('/orgs/:org', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      await requireCapability(db, req, 'org:manage', { kind: 'org', org: orgOf(req) });
      const found = await getOrg(db, orgOf(req));
      if (!found) throw new ApiError(PROBLEMS.notFound, `no org ${orgOf(req)}`);
      return found;
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
        const updated = await updateOrg(tx, org, { name: name ?? null, ref: ref ?? null, status: status ?? null });
        if (!updated) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        return { result: updated, resource: `org:${org}` };
      });
    });

    api.delete('/orgs/:org', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await requireCapability(db, req, 'platform:config', { kind: 'platform' });
      const org = orgOf(req);
      await auditedChange(deps, req, 'org.delete', org, async (tx) => {
        if (!(await deleteOrg(tx, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        return { result: null, resource: `org:${org}` };
      });
      return reply.code(204).send();
    });

    api.get('/orgs/:org/groups', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      const org = orgOf(req);
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      await mustExist(org);
      return listGroups(db, org);
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
        return { result: await insertGroup(tx, org, { id, name, ref }, req.principal!.subject), resource: `group:${org}:${id}` };
      });
      return reply.code(201).send(group);
    });

    api.delete('/orgs/:org/groups/:group', { config: { requiredCapability: 'org:manage' } }, async (req, reply) => {
      const org = orgOf(req);
      const group = (req.params as { group: string }).group;
      await requireCapability(db, req, 'org:manage', { kind: 'org', org });
      await auditedChange(deps, req, 'group.delete', org, async (tx) => {
        if (!(await deleteGroup(tx, org, group))) throw new ApiError(PROBLEMS.notFound, `no group ${group} in org ${org}`);
        return { result: null, resource: `group:${org}:${group}` };
      });
      return reply.code(204).send();
    });
  };
}
