import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { AgentOperatorIssuer } from '../auth/agent-operator-issuer.ts';
import type { ServiceAccountStatus } from '../auth/service-account-status.ts';
import { callerGrants } from '../authz/capabilities.ts';
import { enforceCapability } from '../authz/capability-hook.ts';
import type { ChangeDeps } from '../audited-change.ts';
import type { ErasureDeps } from '../erasure.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import type { IdpProvisioner } from '../idp/provisioner.ts';
import { CONTROLPLANE_DEFAULTS } from '../options.ts';
import type { AuditStore } from '../../audit-wal/store.ts';
import { agentOperatorRoutes } from '../routes/agent-operator.ts';
import { agentRoutes } from '../routes/agents.ts';
import { auditRoutes, type AuditReadOptions } from '../routes/audit.ts';
import { configValueRoutes } from '../routes/config-values.ts';
import { enclaveRoutes } from '../routes/enclaves.ts';
import { erasureRoutes } from '../routes/erasure.ts';
import { governanceRoutes } from '../routes/governance.ts';
import { grantRoutes } from '../routes/grants.ts';
import { idpConnectorRoutes } from '../routes/idp-connectors.ts';
import { policyRoutes } from '../routes/policy.ts';
import { featureFlagRoutes } from '../routes/feature-flags.ts';
import { effectivePolicyRoutes } from '../routes/effective-policy.ts';
import { STRING, STRINGS, viewSchema } from '../../core/schemas.ts';
import { OPENAPI_ROUTE } from '../openapi.ts';
import { memberRoutes } from '../routes/members.ts';
import { orgRoutes } from '../routes/orgs.ts';
import { roleRoutes } from '../routes/roles.ts';
import { serviceAccountRoutes } from '../routes/service-accounts.ts';

// The operator API under /api/v1: the capability hook (a route's declared capability is what enforces
// it, authz/capability-hook.ts), its OpenAPI document, then every route family (mountApi). The document
// is collected by mountApi over a never-listening instance with every family (server.ts).

/** The /api/v1 context: GET /openapi.json and the route families this process wired. */
export function apiRoutes(deps: ChangeDeps, document: unknown, wired: Families) {
  return async (api: FastifyInstance) => {
    api.addHook('preValidation', enforceCapability(deps.db));
    api.addHook('preValidation', jsonBodiesOnly);
    api.get('/openapi.json', OPENAPI_ROUTE, async () => document);
    await mountApi(api, deps, wired);
  };
}

/**
 * A route's body is a JSON object. fastify parses `text/plain` into a string, and validates a body
 * schema keyed by media type (routes/schemas.ts optionalBody) only for the types it names, so without
 * this a text/plain body would reach the handler unvalidated. Runs after the capability check: a caller
 * without the capability learns nothing of the body's shape. Routes without a body schema ignore a body.
 */
async function jsonBodiesOnly(req: FastifyRequest): Promise<void> {
  if (typeof req.body === 'string' && req.routeOptions.schema?.body) {
    throw new ApiError(PROBLEMS.badRequest, 'body: must be a JSON object');
  }
}

const WHOAMI_VIEW = viewSchema('whoamiView', {
  subject: STRING,
  kind: STRING,
  org_id: STRING,
  groups: STRINGS,
  capabilities: STRINGS,
});

export interface Families {
  agentIssuer: AgentOperatorIssuer | null;
  idp: IdpProvisioner | null;
  accountStatus: ServiceAccountStatus;
  events: EventHub;
  auditStore: AuditStore | null;
  auditRead: AuditReadOptions;
  erasure: ErasureDeps;
  erasureJobs: Set<Promise<void>>;
  /** Grace of a pending IdP undo (options.idpUndoGraceMs); the default where not given. */
  idpUndoGraceMs?: number;
}

/** Every route under /api/v1; a family whose backing capability is not wired is not mounted. */
export async function mountApi(api: FastifyInstance, deps: ChangeDeps, wired: Families): Promise<void> {
  // Requires only a valid token (spec: Authentication, rule 1).
  api.get(
    '/whoami',
    {
      config: { requiredCapability: null },
      schema: { response: { 200: WHOAMI_VIEW } },
    },
    async (req) => {
      const p = req.principal!;
      const { groups, grants } = await callerGrants(deps.db, p.subject, p.orgId);
      return {
        subject: p.subject,
        kind: p.kind,
        org_id: p.orgId,
        groups,
        capabilities: [...new Set(grants.map((g) => g.capability))].sort(),
      };
    },
  );
  await api.register(grantRoutes(deps));
  await api.register(roleRoutes(deps));
  await api.register(orgRoutes(deps));
  await api.register(memberRoutes(deps));
  await api.register(idpConnectorRoutes(deps));
  await api.register(policyRoutes(deps, wired.events));
  await api.register(featureFlagRoutes(deps, wired.events));
  await api.register(effectivePolicyRoutes(deps));
  await api.register(configValueRoutes(deps, wired.events));
  await api.register(agentRoutes(deps, wired.events));
  await api.register(governanceRoutes(deps, wired.events));
  await api.register(enclaveRoutes(deps, wired.events));
  if (wired.agentIssuer) await api.register(agentOperatorRoutes(deps, wired.agentIssuer));
  await api.register(erasureRoutes(deps, wired.erasure, wired.erasureJobs));
  if (wired.auditStore) await api.register(auditRoutes(deps, wired.auditStore, wired.auditRead));
  if (wired.idp)
    await api.register(
      serviceAccountRoutes(
        deps,
        wired.idp,
        wired.accountStatus,
        wired.idpUndoGraceMs ?? CONTROLPLANE_DEFAULTS.idpUndoGraceMs,
      ),
    );
}
