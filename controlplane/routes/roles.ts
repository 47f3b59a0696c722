import type { FastifyInstance } from 'fastify';
import { BUILT_IN_ROLES, builtInRole, CAPABILITIES, type Capability } from '../authz/capabilities.ts';
import { requireConferrable } from '../authz/confer.ts';
import { PLATFORM } from '../authz/targets.ts';
import {
  arrayOf,
  NO_CONTENT,
  object as objectSchema,
  pathParams,
  STRING,
  STRINGS,
  viewSchema,
} from '../../core/schemas.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { deleteRole, insertRole, listCustomRoles, roleIsGranted, updateRole } from '../store/roles.ts';

// Roles (spec: createRoleReq, putRoleReq, roleView): the built-in roles and custom ones, platform-wide,
// managed with platform:config. Built-in roles are listed but cannot be changed or deleted; a custom
// role still granted somewhere cannot be deleted (409).

function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

function capabilitiesOf(body: Record<string, unknown>): string[] {
  const caps = body.capabilities;
  if (!Array.isArray(caps)) bad('capabilities', 'must be an array of capability names');
  caps.forEach((c, i) => {
    if (typeof c !== 'string' || !(CAPABILITIES as readonly string[]).includes(c))
      bad(`capabilities[${i}]`, `unknown capability (one of ${CAPABILITIES.join(', ')})`);
  });
  return [...new Set(caps as string[])];
}

const ROLE_VIEW = viewSchema('roleView', { name: STRING, capabilities: STRINGS });
// What the names and capabilities may be is checked by the handler (its messages name the field).
const CREATE_ROLE = objectSchema({ name: {}, capabilities: {} }, [], 'createRoleReq');
const PUT_ROLE = objectSchema({ capabilities: {} }, [], 'putRoleReq');
const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;

const NAME = /^[a-z][a-z0-9-]{1,62}$/;

export function roleRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const platform = { kind: 'platform' } as const;
  return async (api: FastifyInstance) => {
    api.get('/roles', { config: platformConfig, schema: { response: { 200: arrayOf(ROLE_VIEW) } } }, async () => {
      const rows = await listCustomRoles(db);
      const builtIn = Object.entries(BUILT_IN_ROLES).map(([name, caps]) => ({ name, capabilities: [...caps] }));
      return [...builtIn, ...rows];
    });

    api.post(
      '/roles',
      {
        config: platformConfig,
        schema: { body: CREATE_ROLE, response: { 201: ROLE_VIEW } },
      },
      async (req, reply) => {
        const body = req.body as Record<string, unknown>;
        const name = body.name;
        if (typeof name !== 'string' || !NAME.test(name))
          bad('name', 'must be 2–63 lowercase letters, digits or dashes, starting with a letter');
        if (builtInRole(name)) throw new ApiError(PROBLEMS.conflict, `"${name}" is a built-in role`);
        const capabilities = capabilitiesOf(body);
        await requireConferrable(db, req, capabilities as Capability[], platform, `role ${name}`);
        const role = await auditedChange(deps, req, 'role.create', '', async (tx) => {
          await insertRole(tx, { name, capabilities }, req.principal!.subject);
          return { result: { name, capabilities }, resource: `role:${name}` };
        });
        return reply.code(201).send(role);
      },
    );

    api.put(
      '/roles/:name',
      {
        config: platformConfig,
        schema: { params: pathParams('name'), body: PUT_ROLE, response: { 200: ROLE_VIEW } },
      },
      async (req) => {
        const name = (req.params as { name: string }).name;
        if (builtInRole(name))
          throw new ApiError(PROBLEMS.conflict, `"${name}" is a built-in role and cannot be changed`);
        const capabilities = capabilitiesOf(req.body as Record<string, unknown>);
        // A role's definition reaches every holder of the role: it may carry only what the caller holds.
        await requireConferrable(db, req, capabilities as Capability[], platform, `role ${name}`);
        return auditedChange(deps, req, 'role.update', '', async (tx) => {
          if (!(await updateRole(tx, { name, capabilities }))) throw new ApiError(PROBLEMS.notFound, `no role ${name}`);
          return { result: { name, capabilities }, resource: `role:${name}` };
        });
      },
    );

    api.delete(
      '/roles/:name',
      {
        config: platformConfig,
        schema: { params: pathParams('name'), response: NO_CONTENT },
      },
      async (req, reply) => {
        const name = (req.params as { name: string }).name;
        if (builtInRole(name))
          throw new ApiError(PROBLEMS.conflict, `"${name}" is a built-in role and cannot be deleted`);
        await auditedChange(deps, req, 'role.delete', '', async (tx) => {
          if (await roleIsGranted(tx, name))
            throw new ApiError(PROBLEMS.conflict, `role ${name} is still granted; revoke its grants first`);
          if (!(await deleteRole(tx, name))) throw new ApiError(PROBLEMS.notFound, `no role ${name}`);
          return { result: null, resource: `role:${name}` };
        });
        return reply.code(204).send();
      },
    );
  };
}
