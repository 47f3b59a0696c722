import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PATH_ORG, PLATFORM } from '../authz/targets.ts';
import { arrayOf, NO_CONTENT, object, pathParams, STRING, TEXT, viewSchema } from './schemas.ts';
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

const ORG_VIEW = viewSchema('orgView', {
  id: STRING,
  kind: STRING,
  name: STRING,
  provider_org_ref: STRING,
  status: STRING,
});
const GROUP_VIEW = viewSchema('groupView', { id: STRING, name: STRING, org_id: STRING, provider_group_ref: STRING });
const CREATE_ORG = object(
  { id: TEXT, name: TEXT, provider_org_ref: STRING, status: STRING },
  ['id', 'name'],
  'createOrgReq',
);
const UPDATE_ORG = object({ name: STRING, provider_org_ref: STRING, status: STRING }, [], 'updateOrgReq');
const CREATE_GROUP = object({ id: TEXT, name: TEXT, provider_group_ref: STRING }, ['id', 'name'], 'createGroupReq');
const ORG = pathParams('org');
const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;
const orgManage = { requiredCapability: 'org:manage', capabilityTarget: PATH_ORG } as const;

const ORG_COLUMNS = 'id, kind, name, provider_org_ref, status';
const GROUP_COLUMNS = 'id, name, org_id, provider_group_ref';

export function orgRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const orgOf = (req: FastifyRequest) => (req.params as { org: string }).org;
  const mustExist = async (org: string) => {
    if ((await db.query('SELECT 1 FROM orgs WHERE id = $1', [org])).rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get('/orgs', { config: platformConfig, schema: { response: { 200: arrayOf(ORG_VIEW) } } }, async (req) => {
      return (await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs ORDER BY id`)).rows;
    });

    api.post('/orgs', {
      config: platformConfig, schema: { body: CREATE_ORG, response: { 201: ORG_VIEW } },
    }, async (req, reply) => {
      const body = req.body as { id: string; name: string; provider_org_ref?: string; status?: string };
      const id = body.id;
      if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      const name = body.name;
      const status = body.status ?? 'active';
      if (!STATUSES.includes(status)) bad('status', `must be one of ${STATUSES.join(', ')}`);
      const ref = body.provider_org_ref ?? '';
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

    api.get('/orgs/:org', { config: orgManage, schema: { params: ORG, response: { 200: ORG_VIEW } } }, async (req) => {
      const { rows } = await db.query<OrgView>(`SELECT ${ORG_COLUMNS} FROM orgs WHERE id = $1`, [orgOf(req)]);
      if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${orgOf(req)}`);
      return rows[0];
    });

    api.put('/orgs/:org', {
      config: orgManage, schema: { params: ORG, body: UPDATE_ORG, response: { 200: ORG_VIEW } },
    }, async (req) => {
      const org = orgOf(req);
      const body = req.body as { name?: string; provider_org_ref?: string; status?: string };
      const { name, provider_org_ref: ref, status } = body;
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

    api.delete('/orgs/:org', {
      config: platformConfig, schema: { params: ORG, response: NO_CONTENT },
    }, async (req, reply) => {
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

    api.get('/orgs/:org/groups', {
      config: orgManage, schema: { params: ORG, response: { 200: arrayOf(GROUP_VIEW) } },
    }, async (req) => {
      const org = orgOf(req);
      await mustExist(org);
      return (await db.query<GroupView>(`SELECT ${GROUP_COLUMNS} FROM org_groups WHERE org_id = $1 ORDER BY id`, [org])).rows;
    });

    api.post('/orgs/:org/groups', {
      config: orgManage, schema: { params: ORG, body: CREATE_GROUP, response: { 201: GROUP_VIEW } },
    }, async (req, reply) => {
      const org = orgOf(req);
      await mustExist(org);
      const body = req.body as { id: string; name: string; provider_group_ref?: string };
      const id = body.id;
      if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      const { name } = body;
      const ref = body.provider_group_ref ?? '';
      const group = await auditedChange(deps, req, 'group.create', org, async (tx) => {
        const { rows } = await tx.query<GroupView>(
          `INSERT INTO org_groups (org_id, id, name, provider_group_ref, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING ${GROUP_COLUMNS}`,
          [org, id, name, ref, req.principal!.subject],
        );
        return { result: rows[0], resource: `group:${org}:${id}` };
      });
      return reply.code(201).send(group);
    });

    api.delete('/orgs/:org/groups/:group', {
      config: orgManage, schema: { params: pathParams('org', 'group'), response: NO_CONTENT },
    }, async (req, reply) => {
      const org = orgOf(req);
      const group = (req.params as { group: string }).group;
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
