import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PATH_ORG, PLATFORM } from '../authz/targets.ts';
import { arrayOf, NO_CONTENT, object, pathParams, STRING, TEXT, viewSchema } from '../../core/schemas.ts';
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

export function orgRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const orgOf = (req: FastifyRequest) => (req.params as { org: string }).org;
  const mustExist = async (org: string) => {
    if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get('/orgs', { config: platformConfig, schema: { response: { 200: arrayOf(ORG_VIEW) } } }, async () => {
      return listOrgs(db);
    });

    api.post(
      '/orgs',
      {
        config: platformConfig,
        schema: { body: CREATE_ORG, response: { 201: ORG_VIEW } },
      },
      async (req, reply) => {
        const body = req.body as { id: string; name: string; provider_org_ref?: string; status?: string };
        const id = body.id;
        if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
        const name = body.name;
        const status = body.status ?? 'active';
        if (!STATUSES.includes(status)) bad('status', `must be one of ${STATUSES.join(', ')}`);
        const ref = body.provider_org_ref ?? '';
        // An erased org's id is never reused: its data key is gone for good.
        if (await orgWasErased(db, id))
          throw new ApiError(PROBLEMS.conflict, `org ${id} was erased; its id is not reused`);
        const org = await auditedChange(deps, req, 'org.create', id, async (tx) => {
          return {
            result: await insertOrg(tx, { id, name, ref, status }, req.principal!.subject),
            resource: `org:${id}`,
          };
        });
        return reply.code(201).send(org);
      },
    );

    api.get('/orgs/:org', { config: orgManage, schema: { params: ORG, response: { 200: ORG_VIEW } } }, async (req) => {
      const found = await getOrg(db, orgOf(req));
      if (!found) throw new ApiError(PROBLEMS.notFound, `no org ${orgOf(req)}`);
      return found;
    });

    api.put(
      '/orgs/:org',
      {
        config: orgManage,
        schema: { params: ORG, body: UPDATE_ORG, response: { 200: ORG_VIEW } },
      },
      async (req) => {
        const org = orgOf(req);
        const body = req.body as { name?: string; provider_org_ref?: string; status?: string };
        const { name, provider_org_ref: ref, status } = body;
        if (status !== undefined && !STATUSES.includes(status)) bad('status', `must be one of ${STATUSES.join(', ')}`);
        if (name !== undefined && name.trim() === '') bad('name', 'must not be empty');
        return auditedChange(deps, req, 'org.update', org, async (tx) => {
          const updated = await updateOrg(tx, org, { name: name ?? null, ref: ref ?? null, status: status ?? null });
          if (!updated) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
          return { result: updated, resource: `org:${org}` };
        });
      },
    );

    api.delete(
      '/orgs/:org',
      {
        config: platformConfig,
        schema: { params: ORG, response: NO_CONTENT },
      },
      async (req, reply) => {
        const org = orgOf(req);
        await auditedChange(deps, req, 'org.delete', org, async (tx) => {
          if (!(await deleteOrg(tx, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
          return { result: null, resource: `org:${org}` };
        });
        return reply.code(204).send();
      },
    );

    api.get(
      '/orgs/:org/groups',
      {
        config: orgManage,
        schema: { params: ORG, response: { 200: arrayOf(GROUP_VIEW) } },
      },
      async (req) => {
        const org = orgOf(req);
        await mustExist(org);
        return listGroups(db, org);
      },
    );

    api.post(
      '/orgs/:org/groups',
      {
        config: orgManage,
        schema: { params: ORG, body: CREATE_GROUP, response: { 201: GROUP_VIEW } },
      },
      async (req, reply) => {
        const org = orgOf(req);
        await mustExist(org);
        const body = req.body as { id: string; name: string; provider_group_ref?: string };
        const id = body.id;
        if (!ID.test(id)) bad('id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
        const { name } = body;
        const ref = body.provider_group_ref ?? '';
        const group = await auditedChange(deps, req, 'group.create', org, async (tx) => {
          return {
            result: await insertGroup(tx, org, { id, name, ref }, req.principal!.subject),
            resource: `group:${org}:${id}`,
          };
        });
        return reply.code(201).send(group);
      },
    );

    api.delete(
      '/orgs/:org/groups/:group',
      {
        config: orgManage,
        schema: { params: pathParams('org', 'group'), response: NO_CONTENT },
      },
      async (req, reply) => {
        const org = orgOf(req);
        const group = (req.params as { group: string }).group;
        await auditedChange(deps, req, 'group.delete', org, async (tx) => {
          if (!(await deleteGroup(tx, org, group)))
            throw new ApiError(PROBLEMS.notFound, `no group ${group} in org ${org}`);
          return { result: null, resource: `group:${org}:${group}` };
        });
        return reply.code(204).send();
      },
    );
  };
}
