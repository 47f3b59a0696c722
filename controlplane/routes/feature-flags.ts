import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { TOKEN_ORG, tokenOrg } from '../authz/targets.ts';
import { bad } from '../bad-request.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { orgFlags, putFlag } from '../store/feature-flags.ts';
import { orgExists } from '../store/orgs.ts';
import { arrayOf, BOOLEAN, NULLABLE_BOOLEAN, object, pathParams, STRING, viewSchema } from '../../core/schemas.ts';

// Org feature flags (llm-content-policy.md: Endpoints): `inspect:llm` and `audit:llm`, enabled when never
// set, for the caller's org (org:manage over it). A change is audited and published to the org's enclaves.

export const FLAGS = ['inspect:llm', 'audit:llm'] as const;

const FLAG_VIEW = viewSchema('featureFlagView', { flag: STRING, org_id: STRING, enabled: BOOLEAN });
const FLAG_REQ = object({ enabled: NULLABLE_BOOLEAN }, [], 'featureFlagReq');
const FLAG_WRITE_VIEW = viewSchema('featureFlagWriteView', {
  flag: STRING,
  org_id: STRING,
  enabled: BOOLEAN,
  published: BOOLEAN,
});

export function featureFlagRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const p = (req: FastifyRequest) => req.params as { flag: string };
  const orgManage = { requiredCapability: 'org:manage', capabilityTarget: TOKEN_ORG } as const;

  return async (api: FastifyInstance) => {
    api.get('/feature-flags', { config: orgManage, schema: { response: { 200: arrayOf(FLAG_VIEW) } } }, async (req) => {
      const org = tokenOrg(req);
      const set = await orgFlags(db, org);
      return FLAGS.map((flag) => ({ flag, org_id: org, enabled: set.get(flag) ?? true }));
    });
    api.put(
      '/feature-flags/:flag',
      { config: orgManage, schema: { params: pathParams('flag'), body: FLAG_REQ, response: { 200: FLAG_WRITE_VIEW } } },
      async (req) => {
        const org = tokenOrg(req);
        const flag = p(req).flag;
        if (!(FLAGS as readonly string[]).includes(flag))
          throw new ApiError(PROBLEMS.notFound, `no feature flag ${flag} (one of ${FLAGS.join(', ')})`);
        const enabled = (req.body as { enabled?: boolean | null }).enabled;
        if (enabled === undefined || enabled === null) bad('enabled', 'is required (a boolean)');
        if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        return auditedChange(deps, req, 'feature-flag.put', org, async (tx) => {
          await putFlag(tx, org, flag, enabled, req.principal!.subject);
          const published = await events.publishTo(tx, { kind: 'org', org }, 'flags.changed', { flag, org_id: org });
          return { result: { flag, org_id: org, enabled, published }, resource: `feature-flag:${org}:${flag}` };
        }).finally(() => events.wake());
      },
    );
  };
}
