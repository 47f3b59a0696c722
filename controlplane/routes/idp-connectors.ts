import type { FastifyInstance, FastifyRequest } from 'fastify';
import { requireCapability } from '../authz/guard.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { bad, object, strings, text, url } from '../body.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { orgExists as orgStored } from '../store/orgs.ts';
import { deleteConnector, getConnector, listConnectors, upsertConnector } from '../store/idp-connectors.ts';

// An org's IdP connectors (spec: idpConnectorReq / idpConnectorView), under org:manage over the org in
// the path. `client_secret` is write-only: stored (sealed under the org's data key), never answered; a PUT without it keeps the stored one.
// Types: "oidc" (issuer and client_id required) and "saml" (metadata_url required).

const NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;
const FIELDS = ['name', 'type', 'issuer', 'metadata_url', 'client_id', 'client_secret', 'groups_attribute', 'scopes'];

export function idpConnectorRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const params = (req: FastifyRequest) => req.params as { org: string; name: string };
  const guard = (req: FastifyRequest) => requireCapability(db, req, 'org:manage', { kind: 'org', org: params(req).org });
  const orgExists = async (org: string) => {
    if (!(await orgStored(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get('/orgs/:org/idp-connectors', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      await guard(req);
      await orgExists(params(req).org);
      return listConnectors(db, params(req).org);
    });

    api.get('/orgs/:org/idp-connectors/:name', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      await guard(req);
      const connector = await getConnector(db, params(req).org, params(req).name);
      if (!connector) throw new ApiError(PROBLEMS.notFound, `no IdP connector ${params(req).name} in org ${params(req).org}`);
      return connector;
    });

    api.put('/orgs/:org/idp-connectors/:name', { config: { requiredCapability: 'org:manage' } }, async (req) => {
      await guard(req);
      const { org, name } = params(req);
      if (!NAME.test(name)) bad('name', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      const body = object(req.body, FIELDS);
      const named = text(body, 'name', false);
      if (named !== undefined && named !== name) bad('name', `must match the path (${name}) when given`);
      const type = text(body, 'type', true)!;
      if (type !== 'oidc' && type !== 'saml') bad('type', 'must be "oidc" or "saml"');
      const issuer = url(body, 'issuer', type === 'oidc') ?? '';
      const metadataUrl = url(body, 'metadata_url', type === 'saml') ?? '';
      const clientId = text(body, 'client_id', type === 'oidc') ?? '';
      const clientSecret = text(body, 'client_secret', false);
      const groupsAttribute = text(body, 'groups_attribute', false) ?? '';
      const scopes = strings(body, 'scopes') ?? [];
      await orgExists(org);
      const sealed = clientSecret === undefined ? undefined : deps.keys ? await deps.keys.seal(org, clientSecret) : clientSecret;
      return auditedChange(deps, req, 'idp-connector.put', org, async (tx) => {
        const connector = { org, name, type, issuer, metadataUrl, clientId, sealedSecret: sealed ?? null, groupsAttribute, scopes };
        return { result: await upsertConnector(tx, connector, req.principal!.subject), resource: `idp-connector:${org}:${name}` };
      });
    });

    api.delete('/orgs/:org/idp-connectors/:name', { config: { requiredCapability: 'org:manage' } }, async (req, reply) => {
      await guard(req);
      const { org, name } = params(req);
      await auditedChange(deps, req, 'idp-connector.delete', org, async (tx) => {
        if (!(await deleteConnector(tx, org, name))) throw new ApiError(PROBLEMS.notFound, `no IdP connector ${name} in org ${org}`);
        return { result: null, resource: `idp-connector:${org}:${name}` };
      });
      return reply.code(204).send();
    });
  };
}
