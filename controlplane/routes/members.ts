import type { FastifyInstance, FastifyRequest } from 'fastify';
import { effectiveCapabilities, groupsOf } from '../authz/capabilities.ts';
import { conferredBy, grantScope, requireConferrable } from '../authz/confer.ts';
import { requireCapability } from '../authz/guard.ts';
import { PATH_ORG } from '../authz/targets.ts';
import {
  arrayOf,
  NO_CONTENT,
  object,
  optionalBody,
  pathParams,
  STRING,
  STRINGS,
  viewSchema,
} from '../../core/schemas.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { orgExists } from '../store/orgs.ts';
import { groupExists } from '../store/groups.ts';
import { grantsTo } from '../store/grants.ts';
import {
  addMembership,
  memberExists,
  membersOfOrg,
  offboardMember,
  removeMembership,
  upsertMember,
} from '../store/members.ts';

// Members of an org, their group memberships, what they may do, and offboarding (spec: memberView,
// effectiveView, offboardUserView). All under members:* over the org in the path, except `effective`,
// which also answers a member asking about themself.

function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

const MEMBER_VIEW = viewSchema('memberView', { subject: STRING, username: STRING, email: STRING });
const OFFBOARD_VIEW = viewSchema('offboardUserView', { subject: STRING });
const EFFECTIVE_VIEW = viewSchema('effectiveView', {
  subject: STRING,
  org_id: STRING,
  groups: STRINGS,
  capabilities: STRINGS,
});
const PUT_MEMBER = object({ username: STRING, email: STRING }, [], 'putMemberReq');
const membersManage = { requiredCapability: 'members:*', capabilityTarget: PATH_ORG } as const;

export function memberRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const params = (req: FastifyRequest) => req.params as { org: string; subject: string; group: string };
  const target = (req: FastifyRequest) => ({ kind: 'org' as const, org: params(req).org });
  const mustExist = async (org: string) => {
    if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get(
      '/orgs/:org/members',
      {
        config: membersManage,
        schema: { params: pathParams('org'), response: { 200: arrayOf(MEMBER_VIEW) } },
      },
      async (req) => {
        // One round trip: the org (for its 404) and its members.
        const members = await membersOfOrg(db, params(req).org);
        if (!members) throw new ApiError(PROBLEMS.notFound, `no org ${params(req).org}`);
        return members;
      },
    );

    api.put(
      '/orgs/:org/members/:subject',
      {
        config: membersManage,
        schema: {
          params: pathParams('org', 'subject'),
          body: optionalBody(PUT_MEMBER),
          response: { 200: MEMBER_VIEW },
        },
      },
      async (req) => {
        const { org, subject } = params(req);
        await mustExist(org);
        const body = (req.body ?? {}) as { username?: string; email?: string };
        const { email } = body;
        const malformed = email !== undefined && email !== '' && !/^[^@\s]+@[^@\s]+$/.test(email);
        if (malformed) bad('email', 'is not an email address');
        return auditedChange(deps, req, 'member.put', org, async (tx) => {
          const member = { subject, username: (body.username ?? '') as string, email: (body.email ?? '') as string };
          return {
            result: await upsertMember(tx, org, member, req.principal!.subject),
            resource: `member:${org}:${subject}`,
          };
        });
      },
    );

    // A group membership, added or removed: no body, 204.
    const membership = {
      config: membersManage,
      schema: { params: pathParams('org', 'group', 'subject'), response: NO_CONTENT },
    };
    api.put('/orgs/:org/groups/:group/members/:subject', membership, async (req, reply) => {
      const { org, group, subject } = params(req);
      if (!(await groupExists(db, org, group)))
        throw new ApiError(PROBLEMS.notFound, `no group ${group} in org ${org}`);
      if (!(await memberExists(db, org, subject)))
        throw new ApiError(PROBLEMS.notFound, `${subject} is not a member of org ${org}`);
      // A membership confers the group's grants: only a caller holding all of them may add one.
      const carried = await grantsTo(db, `group:${org}:${group}`);
      for (const g of carried)
        await requireConferrable(
          db,
          req,
          await conferredBy(db, g.role, g.capability),
          grantScope(g),
          `membership of group ${group}`,
        );
      await auditedChange(deps, req, 'membership.put', org, async (tx) => {
        await addMembership(tx, org, group, subject);
        return { result: null, resource: `membership:${org}:${group}:${subject}` };
      });
      return reply.code(204).send();
    });

    api.delete('/orgs/:org/groups/:group/members/:subject', membership, async (req, reply) => {
      const { org, group, subject } = params(req);
      await auditedChange(deps, req, 'membership.delete', org, async (tx) => {
        if (!(await removeMembership(tx, org, group, subject)))
          throw new ApiError(PROBLEMS.notFound, `${subject} is not in group ${group}`);
        return { result: null, resource: `membership:${org}:${group}:${subject}` };
      });
      return reply.code(204).send();
    });

    // Offboarding: the member, their group memberships and every grant to them in the org, at once.
    api.post(
      '/orgs/:org/members/:subject/offboard',
      {
        config: membersManage,
        schema: { params: pathParams('org', 'subject'), response: { 200: OFFBOARD_VIEW } },
      },
      async (req) => {
        const { org, subject } = params(req);
        return auditedChange(deps, req, 'member.offboard', org, async (tx) => {
          if (!(await offboardMember(tx, org, subject)))
            throw new ApiError(PROBLEMS.notFound, `${subject} is not a member of org ${org}`);
          return { result: { subject }, resource: `member:${org}:${subject}` };
        });
      },
    );

    // A member may ask about themself; anyone else needs members:* over the org.
    const selfOrMembersManage = async (req: FastifyRequest) => {
      const { org, subject } = params(req);
      const self =
        req.principal?.subject === subject && req.principal?.orgId === org && req.principal?.kind !== 'agent-operator';
      if (!self) await requireCapability(db, req, 'members:*', target(req));
    };
    api.get(
      '/orgs/:org/members/:subject/effective',
      {
        config: { requiredCapability: 'members:*', authorize: selfOrMembersManage, targetLabel: 'path-org' },
        schema: { params: pathParams('org', 'subject'), response: { 200: EFFECTIVE_VIEW } },
      },
      async (req) => {
        const { org, subject } = params(req);
        const groups = await groupsOf(db, org, subject);
        const grants = await effectiveCapabilities(db, { subject, orgId: org, groups });
        return { subject, org_id: org, groups, capabilities: [...new Set(grants.map((g) => g.capability))].sort() };
      },
    );
  };
}
