import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PATH_ORG } from '../authz/targets.ts';
import {
  arrayOf,
  NO_CONTENT,
  NON_EMPTY_STRINGS,
  NULLABLE_STRING,
  object,
  pathParams,
  STRING,
  TEXT,
  viewSchema,
} from '../../core/schemas.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { bad, httpsUrl } from '../bad-request.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { orgExists as orgStored } from '../store/orgs.ts';
import { deleteConnector, getConnector, listConnectors, upsertConnector } from '../store/idp-connectors.ts';

// An org's IdP connectors (spec: idpConnectorReq / idpConnectorView), under org:manage over the org in
// the path. `client_secret` is write-only: stored (sealed under the org's data key), never answered; a PUT without it
// keeps the stored one.
// Types: "oidc" (issuer and client_id required) and "saml" (metadata_url required).

const NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;
const CONNECTOR_VIEW = viewSchema('idpConnectorView', {
  name: STRING,
  type: STRING,
  org_id: STRING,
  status: STRING,
  groups_attribute: STRING,
});
// null is absent; which fields a type requires, and the URLs, are checked by the handler.
const CONNECTOR_REQ = object(
  {
    name: NULLABLE_STRING,
    type: TEXT,
    issuer: NULLABLE_STRING,
    metadata_url: NULLABLE_STRING,
    client_id: NULLABLE_STRING,
    client_secret: NULLABLE_STRING,
    groups_attribute: NULLABLE_STRING,
    scopes: NON_EMPTY_STRINGS,
  },
  ['type'],
  'idpConnectorReq',
);
type ConnectorReq = { type: string; scopes?: string[] | null } & Partial<
  Record<'name' | 'issuer' | 'metadata_url' | 'client_id' | 'client_secret' | 'groups_attribute', string | null>
>;

/** A field `type` requires: present and not blank. */
function needed(body: ConnectorReq, field: 'issuer' | 'metadata_url' | 'client_id', required: boolean): string {
  const v = body[field];
  if (required && (v === undefined || v === null)) bad(field, 'is required');
  if (required && v!.trim() === '') bad(field, 'must not be empty');
  return v ?? '';
}
const orgManage = { requiredCapability: 'org:manage', capabilityTarget: PATH_ORG } as const;

export function idpConnectorRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const params = (req: FastifyRequest) => req.params as { org: string; name: string };
  const orgExists = async (org: string) => {
    if (!(await orgStored(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };

  return async (api: FastifyInstance) => {
    api.get(
      '/orgs/:org/idp-connectors',
      {
        config: orgManage,
        schema: { params: pathParams('org'), response: { 200: arrayOf(CONNECTOR_VIEW) } },
      },
      async (req) => {
        await orgExists(params(req).org);
        return listConnectors(db, params(req).org);
      },
    );

    api.get(
      '/orgs/:org/idp-connectors/:name',
      {
        config: orgManage,
        schema: { params: pathParams('org', 'name'), response: { 200: CONNECTOR_VIEW } },
      },
      async (req) => {
        const connector = await getConnector(db, params(req).org, params(req).name);
        if (!connector)
          throw new ApiError(PROBLEMS.notFound, `no IdP connector ${params(req).name} in org ${params(req).org}`);
        return connector;
      },
    );

    api.put(
      '/orgs/:org/idp-connectors/:name',
      {
        config: orgManage,
        schema: { params: pathParams('org', 'name'), body: CONNECTOR_REQ, response: { 200: CONNECTOR_VIEW } },
      },
      async (req) => {
        const { org, name } = params(req);
        if (!NAME.test(name)) bad('name', 'must be 1–63 lowercase letters, digits, "-" or "_"');
        const body = req.body as ConnectorReq;
        const named = body.name ?? undefined;
        if (named !== undefined && named !== name) bad('name', `must match the path (${name}) when given`);
        const type = body.type;
        if (type !== 'oidc' && type !== 'saml') bad('type', 'must be "oidc" or "saml"');
        const issuer = httpsUrl('issuer', needed(body, 'issuer', type === 'oidc')) ?? '';
        const metadataUrl = httpsUrl('metadata_url', needed(body, 'metadata_url', type === 'saml')) ?? '';
        const clientId = needed(body, 'client_id', type === 'oidc');
        const clientSecret = body.client_secret ?? undefined;
        const groupsAttribute = body.groups_attribute ?? '';
        const scopes = body.scopes ?? [];
        await orgExists(org);
        const sealed =
          clientSecret === undefined ? undefined : deps.keys ? await deps.keys.seal(org, clientSecret) : clientSecret;
        return auditedChange(deps, req, 'idp-connector.put', org, async (tx) => {
          const connector = {
            org,
            name,
            type,
            issuer,
            metadataUrl,
            clientId,
            sealedSecret: sealed ?? null,
            groupsAttribute,
            scopes,
          };
          return {
            result: await upsertConnector(tx, connector, req.principal!.subject),
            resource: `idp-connector:${org}:${name}`,
          };
        });
      },
    );

    api.delete(
      '/orgs/:org/idp-connectors/:name',
      {
        config: orgManage,
        schema: { params: pathParams('org', 'name'), response: NO_CONTENT },
      },
      async (req, reply) => {
        const { org, name } = params(req);
        await auditedChange(deps, req, 'idp-connector.delete', org, async (tx) => {
          if (!(await deleteConnector(tx, org, name)))
            throw new ApiError(PROBLEMS.notFound, `no IdP connector ${name} in org ${org}`);
          return { result: null, resource: `idp-connector:${org}:${name}` };
        });
        return reply.code(204).send();
      },
    );
  };
}
