import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import { arrayOf, NO_CONTENT, object, query, STRING, viewSchema } from '../../../core/schemas.ts';
import { getAgent } from '../agents.ts';
import type { BrokerDeps } from '../deps.ts';
import { deleteSecret, listSecrets, MAX_SECRET_BYTES, putSecret, SECRET_NAME, type SecretScope } from '../secrets.ts';
import { requireCapability } from './auth.ts';

// The enclave's secret authoring, over the caller's org (`secrets:manage`, which admins hold):
//   PUT    /api/v1/secrets/{name}[?agent=UID | ?group=GROUP]  {value} → 200 {name, scope}
//   DELETE /api/v1/secrets/{name}[?agent=UID | ?group=GROUP]          → 204; 404 when there is none
//   GET    /api/v1/secrets                                            → [{name, scope, updated_at}]
// Without agent or group the scope is the caller's org (where `llmproxy:llm.api_key` lives); both is a
// 400. An agent scope names an agent of the caller's org the broker knows (404 otherwise). No answer,
// log line or audit record carries a value: they name the secret and its scope.

const SECRET_REQ = object({ value: STRING }, ['value'], 'secretReq');
const SECRET_VIEW = viewSchema('secretView', { name: STRING, scope: STRING });
const SECRET_LISTING = viewSchema('secretListing', { name: STRING, scope: STRING, updated_at: STRING });
const SCOPE_QUERY = query(['agent', 'group'], true);
/** Ids of groups and agents: visible characters, no whitespace, as the control plane's ids are. */
const SCOPE_ID = /^[^\p{C}\s]{1,200}$/u;

export function secretRoutes(deps: BrokerDeps) {
  const { db } = deps;
  const actor = (req: FastifyRequest) => ({
    subject: req.principal!.subject,
    kind: req.principal!.kind,
    traceId: String(req.id),
  });

  /** The secret's name from the path (a wildcard: a name may be longer than the router's 100-character parameter). */
  const nameOf = (req: FastifyRequest): string => {
    const name = (req.params as { '*': string })['*'];
    if (!SECRET_NAME.test(name))
      throw new ApiError(PROBLEMS.badRequest, 'name: must be 1 to 200 characters of A-Z a-z 0-9 . _ : -');
    return name;
  };

  /** The scope the query names, within the caller's org. */
  const scopeOf = async (req: FastifyRequest, mustExist: boolean): Promise<SecretScope> => {
    const org = req.principal!.orgId;
    const q = req.query as { agent?: string; group?: string };
    if (q.agent !== undefined && q.group !== undefined)
      throw new ApiError(PROBLEMS.badRequest, 'agent and group are mutually exclusive: a secret has one scope');
    if (q.group !== undefined) {
      if (!SCOPE_ID.test(q.group)) throw new ApiError(PROBLEMS.badRequest, 'group: must be a group id');
      return { kind: 'group', org, group: q.group };
    }
    if (q.agent !== undefined) {
      if (!SCOPE_ID.test(q.agent)) throw new ApiError(PROBLEMS.badRequest, 'agent: must be an agent id');
      if (mustExist) {
        const agent = await getAgent(db, q.agent);
        if (!agent || agent.org_id !== org)
          throw new ApiError(PROBLEMS.notFound, `this enclave runs no agent ${q.agent} in org ${org}`);
      }
      return { kind: 'agent', org, uid: q.agent };
    }
    return { kind: 'org', org };
  };

  // The capability is checked before the body and the query are (a caller without it learns nothing
  // of what a valid request looks like).
  const preValidation = async (req: FastifyRequest) => void (await requireCapability(db, req, 'secrets:manage'));

  return async (api: FastifyInstance) => {
    api.get('/secrets', { preValidation, schema: { response: { 200: arrayOf(SECRET_LISTING) } } }, async (req) =>
      listSecrets(db, req.principal!.orgId),
    );

    api.put(
      '/secrets/*',
      {
        preValidation,
        // A value of 64 KiB may take six times that as JSON (every character escaped).
        bodyLimit: 6 * MAX_SECRET_BYTES + 1024,
        schema: { body: SECRET_REQ, querystring: SCOPE_QUERY, response: { 200: SECRET_VIEW } },
      },
      async (req) => {
        const name = nameOf(req);
        const { value } = req.body as { value: string };
        if (value.length === 0) throw new ApiError(PROBLEMS.badRequest, 'value: must not be empty');
        if (Buffer.byteLength(value, 'utf8') > MAX_SECRET_BYTES)
          throw new ApiError(PROBLEMS.badRequest, `value: must be at most ${MAX_SECRET_BYTES} bytes`);
        return putSecret(deps, actor(req), await scopeOf(req, true), name, value);
      },
    );

    api.delete(
      '/secrets/*',
      { preValidation, schema: { querystring: SCOPE_QUERY, response: NO_CONTENT } },
      async (req, reply) => {
        const name = nameOf(req);
        // An agent the broker no longer knows may still hold secrets of the org: they can be deleted.
        await deleteSecret(deps, actor(req), await scopeOf(req, false), name);
        return reply.code(204).send();
      },
    );
  };
}
