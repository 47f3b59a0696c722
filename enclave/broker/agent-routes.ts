import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import pkg from '../../package.json' with { type: 'json' };
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { PROBLEM_CONTENT_TYPE, problem } from '../../core/problem.ts';
import type { Queryable } from '../../core/sql.ts';
import { AgentConfigLockedError, AgentRouteError, CsrInvalidError, PlatformJwtError } from '../errors.ts';
import { changeStatus, getAgent, refusalOf, type BrokerAgent } from './agents.ts';
import { auditedChange, auditRefusal, type BrokerActor } from './audit.ts';
import { redeemBootstrapToken, tokenHash } from './bootstrap-tokens.ts';
import type { BrokerDeps } from './deps.ts';
import { MAX_CSR_BYTES, type EnclaveCa } from './identity/enclave-ca.ts';
import { bearerToken, verifyPlatformJwt } from './identity/jwt.ts';
import { peekRefreshToken, revokeAgentFamilies, rotate, startFamily } from './identity/refresh-tokens.ts';
import type { SigningKeys } from './identity/signing-keys.ts';

// The agent listener's routes (spec: llm-content-policy, enclave-side agent-facing routes; operator-api,
// States and transitions): the JWKS and discovery (no authentication), the bootstrap and renewal
// exchanges (a bootstrap token / a refresh token in the body), and the agent's own secrets and config
// (bearer platform JWT, verified against the broker's own keys). Every error is a Problem document.
//
// An exchange prepares its whole answer (JWT, certificate, secrets, config) before the transaction that
// uses its token, and that transaction is the last thing it does: a failure on the way leaves the token
// usable, so an agent is never left holding a spent token and nothing else (docs/decisions.md,
// "Agent exchanges").

/** Secrets and config as the agent sees them; the broker's secret and config stores implement it. */
export interface AgentView {
  /** The agent's own secrets, `{name: value}`, merged org → group → agent. Names with `:` are dropped here. */
  secrets(agent: BrokerAgent): Promise<Record<string, string>>;
  /** The agent's config merged platform → org → group → agent, and its hash. */
  config(agent: BrokerAgent): Promise<{ config: Record<string, unknown>; config_hash: string }>;
  /**
   * Writes an agent-scope config value inside `tx` (use only `tx`: the transaction holds the store).
   * Throws AgentConfigLockedError (409) when a broader scope locked `key`.
   */
  putConfig(tx: Queryable, agent: BrokerAgent, key: string, value: unknown): Promise<void>;
}

/** What the agent routes are handed besides the broker's deps. */
export interface AgentIdentity {
  keys: SigningKeys;
  ca: EnclaveCa;
  view: AgentView;
}

const PROBLEM_BASE = 'https://dvx.dev/problems/';
const TITLES: Record<string, string> = {
  'bad-request': 'The request is malformed',
  unauthenticated: 'A valid agent credential is required',
  forbidden: 'The agent may not use the agent routes now',
  'not-found': 'No such resource',
  'refresh-token-replayed': 'The refresh token was used before: its family is revoked',
  'config-locked': 'The config key is locked at a broader scope',
  'request-timeout': 'The request did not arrive in time',
  'payload-too-large': 'The request body is too large',
  'unsupported-media-type': 'The request body is not of a supported media type',
  'uri-too-long': 'The request URI or a path segment is too long',
  'audit-unavailable': 'The change was refused: its audit record could not be made durable',
  internal: 'Internal error',
};
const SLUG_OF_STATUS: Record<number, string> = {
  400: 'bad-request',
  401: 'unauthenticated',
  403: 'forbidden',
  404: 'not-found',
  408: 'request-timeout',
  413: 'payload-too-large',
  414: 'uri-too-long',
  415: 'unsupported-media-type',
};

function sendProblem(reply: FastifyReply, status: number, slug: string, detail: string | undefined, url: string) {
  if (status === 401) reply.header('www-authenticate', 'Bearer');
  return reply
    .code(status)
    .type(PROBLEM_CONTENT_TYPE)
    .header('cache-control', 'no-store')
    .send(
      problem({
        type: PROBLEM_BASE + slug,
        title: TITLES[slug] ?? TITLES['bad-request'],
        status,
        detail,
        instance: url.split('?')[0],
      }),
    );
}

const REPLAYED: unique symbol = Symbol('replayed');
/** Thrown out of a renewal's transaction that met a replay, so that the rotation rolls back. */
const REPLAYED_SIGNAL = new Error('refresh token replayed');

/** A bound on the exchanges' bodies: a token and a P-256 CSR. */
const EXCHANGE_BODY_LIMIT = 64 * 1024;
const CONFIG_BODY_LIMIT = 256 * 1024;
const TOKEN = { type: 'string', minLength: 1, maxLength: 256 };
const CSR = { type: 'string', minLength: 1, maxLength: MAX_CSR_BYTES };
const closed = (properties: Record<string, unknown>, required: string[]) => ({
  type: 'object',
  properties,
  required,
  additionalProperties: false,
});
const BOOTSTRAP_BODY = closed({ token: TOKEN, csr: CSR }, ['token']);
const REFRESH_BODY = closed({ refresh_token: TOKEN, csr: CSR }, ['refresh_token']);
const CONFIG_BODY = closed({ value: {} }, ['value']);
const SECRET_PARAMS = closed({ name: { type: 'string', minLength: 1, maxLength: 256 } }, ['name']);
const CONFIG_PARAMS = closed({ key: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' } }, ['key']);

/** A name an agent may be served: satellite secrets carry a service prefix (`llmproxy:…`, `agent:llmproxy.…`). */
const agentSecretName = (name: string) => !name.includes(':');

const agentActor = (uid: string | null, traceId: string): BrokerActor => ({
  subject: uid ? `agent:${uid}` : 'agent:unknown',
  kind: 'agent',
  traceId,
});

export function agentRoutes(deps: BrokerDeps, identity: AgentIdentity) {
  const { keys, ca, view } = identity;
  const ttl = () => deps.options.refreshTtl;

  /** Refuses an exchange: the refusal is audited (it stands whatever happens to its record), then thrown. */
  async function refuse(
    req: FastifyRequest,
    action: string,
    agent: Pick<BrokerAgent, 'uid' | 'org_id'> | null,
    status: number,
    reason: string,
  ): Promise<never> {
    await auditRefusal(
      deps,
      agentActor(agent?.uid ?? null, req.id),
      action,
      agent?.org_id ?? '',
      agent ? `agent:${agent.uid}` : 'agent',
      reason,
    );
    throw new AgentRouteError(status, SLUG_OF_STATUS[status] ?? 'bad-request', reason);
  }

  async function agentSecrets(agent: BrokerAgent): Promise<Record<string, string>> {
    const all = await view.secrets(agent);
    return Object.fromEntries(Object.entries(all).filter(([name]) => agentSecretName(name)));
  }

  /** Everything a bundle carries but its refresh token, made before the token is used. */
  async function prepare(agent: BrokerAgent, csr: string | undefined, now: number) {
    const [minted, certificate, secrets, config] = await Promise.all([
      keys.mint({ sub: agent.uid, org_id: agent.org_id, agent_name: agent.name, group_id: agent.group_id }),
      csr === undefined
        ? Promise.resolve(undefined)
        : ca.signCsr(csr, { agentId: agent.uid, orgId: agent.org_id, groupId: agent.group_id }, now),
      agentSecrets(agent),
      view.config(agent),
    ]);
    return {
      jwt: minted.jwt,
      secrets,
      config: config.config,
      config_hash: config.config_hash,
      ...(certificate === undefined ? {} : { certificate }),
    };
  }

  async function bootstrap(req: FastifyRequest, body: { token: string; csr?: string }) {
    const now = deps.now();
    const { rows } = await deps.db.query<{ agent_uid: string }>(
      'SELECT agent_uid FROM broker_bootstrap_tokens WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2',
      [tokenHash(body.token), new Date(now)],
    );
    const uid = rows[0]?.agent_uid;
    if (!uid) return refuse(req, 'agent.bootstrap', null, 401, 'unknown, used or expired bootstrap token');
    const agent = await getAgent(deps.db, uid);
    if (!agent) return refuse(req, 'agent.bootstrap', null, 401, 'the bootstrap token names no agent of this enclave');
    const refusal = refusalOf(agent);
    if (refusal) return refuse(req, 'agent.bootstrap', agent, 403, refusal);
    const bundle = await prepare(agent, body.csr, now);
    let family: { familyId: string; token: string };
    try {
      family = await auditedChange(deps, agentActor(uid, req.id), 'agent.bootstrap', agent.org_id, async (tx) => {
        if ((await redeemBootstrapToken(tx, body.token, now)) !== uid)
          throw new AgentRouteError(401, 'unauthenticated', 'bootstrap token already used');
        const current = await getAgent(tx, uid);
        const refusedNow = current ? refusalOf(current) : `agent ${uid} is gone`;
        if (refusedNow) throw new AgentRouteError(403, 'forbidden', refusedNow);
        // One identity per agent: a new bootstrap (an operator re-provisioned it) ends the older ones.
        const revoked = await revokeAgentFamilies(tx, uid, 'rebootstrapped', now);
        const started = await startFamily(tx, uid, ttl(), now);
        await changeStatus(tx, uid, 'active', 'bootstrapped');
        return {
          result: started,
          resource: `agent:${uid}`,
          attrs: {
            family_id: started.familyId,
            certificate: body.csr === undefined ? 'none' : 'issued',
            families_revoked: String(revoked),
          },
        };
      });
    } catch (err) {
      if (err instanceof AgentRouteError) return refuse(req, 'agent.bootstrap', agent, err.status, err.message);
      throw err;
    }
    deps.bus.emit('agent', uid);
    deps.log.info({ agent: uid, org_id: agent.org_id, family_id: family.familyId }, 'agent bootstrapped');
    return {
      agent_id: agent.uid,
      org_id: agent.org_id,
      agent_name: agent.name,
      refresh_token: family.token,
      ...bundle,
    };
  }

  async function refresh(req: FastifyRequest, body: { refresh_token: string; csr?: string }) {
    const now = deps.now();
    const peek = await peekRefreshToken(deps.db, body.refresh_token, now);
    if (!peek) return refuse(req, 'agent.refresh', null, 401, 'unknown or expired refresh token');
    const agent = await getAgent(deps.db, peek.uid);
    if (!agent) return refuse(req, 'agent.refresh', null, 401, 'the refresh token names no agent of this enclave');
    if (peek.state === 'revoked')
      return refuse(req, 'agent.refresh', agent, 401, 'the refresh token family is revoked');
    if (peek.state === 'used') return replayed(req, agent, body.refresh_token, now);
    const refusal = refusalOf(agent);
    if (refusal) return refuse(req, 'agent.refresh', agent, 403, refusal);
    const bundle = await prepare(agent, body.csr, now);
    // A successful renewal changes no state an operator governs and is not audited; its refusals are.
    let next: string | typeof REPLAYED;
    try {
      next = await deps.db.transaction(async (tx) => {
        const r = await rotate(tx, body.refresh_token, ttl(), now);
        if (r && 'replayed' in r) throw REPLAYED_SIGNAL;
        if (!r || !('ok' in r) || r.uid !== agent.uid)
          throw new AgentRouteError(401, 'unauthenticated', 'the refresh token is no longer valid');
        const current = await getAgent(tx, agent.uid);
        const refusedNow = current ? refusalOf(current) : `agent ${agent.uid} is gone`;
        if (refusedNow) throw new AgentRouteError(403, 'forbidden', refusedNow);
        return r.next;
      });
    } catch (err) {
      // Lost a race with a rotation of the same token: a replay after all (the rotation rolled back).
      if (err === REPLAYED_SIGNAL) next = REPLAYED;
      else if (err instanceof AgentRouteError) return refuse(req, 'agent.refresh', agent, err.status, err.message);
      else throw err;
    }
    if (next === REPLAYED) return replayed(req, agent, body.refresh_token, now);
    return { ...bundle, refresh_token: next };
  }

  /**
   * A used refresh token presented again: someone holds a copy. The family is revoked and the agent
   * suspended (reason refresh_token_replayed, reported to the control plane), unless it is refused
   * already (an isolated agent stays isolated); audited; 409.
   */
  async function replayed(req: FastifyRequest, agent: BrokerAgent, token: string, now: number): Promise<never> {
    let outcome: { familyId: string; status: string };
    try {
      outcome = await auditedChange(
        deps,
        agentActor(agent.uid, req.id),
        'agent.refresh_token_replayed',
        agent.org_id,
        async (tx) => {
          const r = await rotate(tx, token, ttl(), now);
          if (!r || !('replayed' in r))
            throw new AgentRouteError(401, 'unauthenticated', 'the refresh token family is revoked');
          const current = await getAgent(tx, agent.uid);
          let status = current?.status ?? 'unknown';
          if (current && !refusalOf(current)) {
            await changeStatus(tx, agent.uid, 'suspended', 'refresh_token_replayed');
            status = 'suspended';
          }
          return {
            result: { familyId: r.familyId, status },
            resource: `agent:${agent.uid}`,
            outcome: 'deny' as const,
            reason: 'refresh_token_replayed',
            attrs: { family_id: r.familyId, status },
          };
        },
      );
    } catch (err) {
      if (err instanceof AgentRouteError) return refuse(req, 'agent.refresh', agent, err.status, err.message);
      throw err;
    }
    deps.bus.emit('agent', agent.uid);
    deps.log.warn(
      { agent: agent.uid, org_id: agent.org_id, family_id: outcome.familyId, status: outcome.status },
      'refresh token replayed: its family is revoked',
    );
    throw new AgentRouteError(
      409,
      'refresh-token-replayed',
      `the refresh token was used before: its family is revoked and agent ${agent.uid} is ${outcome.status}`,
    );
  }

  const authenticated = new WeakMap<FastifyRequest, BrokerAgent>();
  const agentOf = (req: FastifyRequest) => authenticated.get(req)!;

  /** The bearer platform JWT, verified against the broker's keys; its agent known and not refused. */
  async function authenticate(req: FastifyRequest): Promise<void> {
    const token = bearerToken(req.headers.authorization);
    if (!token) throw new AgentRouteError(401, 'unauthenticated', 'a platform JWT is required (Authorization: Bearer)');
    const claims = await verifyPlatformJwt(keys, token, deps.now());
    const agent = await getAgent(deps.db, claims.sub);
    if (!agent || agent.org_id !== claims.org_id)
      throw new AgentRouteError(401, 'unauthenticated', 'the token names no agent of this enclave');
    const refusal = refusalOf(agent);
    if (refusal) {
      await auditRefusal(
        deps,
        agentActor(agent.uid, req.id),
        'agent.request',
        agent.org_id,
        `agent:${agent.uid}`,
        refusal,
      );
      throw new AgentRouteError(403, 'forbidden', refusal);
    }
    authenticated.set(req, agent);
  }

  return async (app: FastifyInstance) => {
    app.setErrorHandler((err: FastifyError, req, reply) => {
      const url = req.url;
      if (err instanceof AgentRouteError) return sendProblem(reply, err.status, err.problem, err.message, url);
      if (err instanceof PlatformJwtError) return sendProblem(reply, 401, 'unauthenticated', err.message, url);
      if (err instanceof CsrInvalidError) return sendProblem(reply, 400, 'bad-request', err.message, url);
      if (err instanceof AgentConfigLockedError) return sendProblem(reply, 409, 'config-locked', err.message, url);
      if (err instanceof AuditUnavailableError)
        return sendProblem(reply, 503, 'audit-unavailable', 'the audit store did not take the record in time', url);
      if (err.validation) return sendProblem(reply, 400, 'bad-request', err.message, url);
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE')
        return sendProblem(reply, 413, 'payload-too-large', 'the request body is too large', url);
      // fastify's own refusals of a request (content type, length, JSON syntax) keep their status.
      if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500)
        return sendProblem(reply, err.statusCode, SLUG_OF_STATUS[err.statusCode] ?? 'bad-request', err.message, url);
      deps.log.error({ err, request_id: req.id, url: url.split('?')[0] }, 'agent route failed');
      return sendProblem(reply, 500, 'internal', undefined, url);
    });

    app.get('/.well-known/jwks.json', async (_req, reply) => {
      // A verifier may keep it this long: a new key is published longer than that before it signs.
      reply.header('cache-control', 'public, max-age=300');
      return keys.jwks();
    });

    app.get('/v1/agent/discover', async () => ({
      service: 'dvx-broker',
      version: pkg.version,
      issuer: keys.issuer,
      endpoints: {
        jwks: '/.well-known/jwks.json',
        bootstrap: '/v1/agent/bootstrap',
        refresh: '/v1/agent/refresh',
        secrets: '/v1/agent/secrets',
        secret: '/v1/agent/secrets/{name}',
        config: '/v1/agent/config',
        config_key: '/v1/agent/config/{key}',
      },
    }));

    app.post(
      '/v1/agent/bootstrap',
      { bodyLimit: EXCHANGE_BODY_LIMIT, schema: { body: BOOTSTRAP_BODY } },
      async (req, reply) => {
        reply.header('cache-control', 'no-store');
        return bootstrap(req, req.body as { token: string; csr?: string });
      },
    );

    app.post(
      '/v1/agent/refresh',
      { bodyLimit: EXCHANGE_BODY_LIMIT, schema: { body: REFRESH_BODY } },
      async (req, reply) => {
        reply.header('cache-control', 'no-store');
        return refresh(req, req.body as { refresh_token: string; csr?: string });
      },
    );

    // The routes behind the platform JWT: authenticated before their body is read.
    await app.register(async (authed) => {
      authed.addHook('onRequest', authenticate);
      authed.addHook('onSend', async (_req, reply) => {
        reply.header('cache-control', 'no-store');
      });

      authed.get('/v1/agent/secrets', async (req) => ({
        secrets: Object.keys(await agentSecrets(agentOf(req))).sort(),
      }));

      authed.get('/v1/agent/secrets/:name', { schema: { params: SECRET_PARAMS } }, async (req) => {
        const { name } = req.params as { name: string };
        const secrets = agentSecretName(name) ? await agentSecrets(agentOf(req)) : {};
        if (!Object.hasOwn(secrets, name))
          throw new AgentRouteError(404, 'not-found', `no secret ${name} for this agent`);
        return { name, value: secrets[name] };
      });

      authed.get('/v1/agent/config', async (req) => view.config(agentOf(req)));

      authed.put(
        '/v1/agent/config/:key',
        { bodyLimit: CONFIG_BODY_LIMIT, schema: { params: CONFIG_PARAMS, body: CONFIG_BODY } },
        async (req) => {
          const agent = agentOf(req);
          const { key } = req.params as { key: string };
          const { value } = req.body as { value: unknown };
          // PostgreSQL's jsonb cannot hold a NUL character: refused here rather than failing in the store.
          if (JSON.stringify(value).includes('\\u0000'))
            throw new AgentRouteError(400, 'bad-request', 'value: must not contain a NUL character');
          try {
            await auditedChange(deps, agentActor(agent.uid, req.id), 'agent.config.write', agent.org_id, async (tx) => {
              await view.putConfig(tx, agent, key, value);
              return { result: undefined, resource: `agent:${agent.uid}`, attrs: { key } };
            });
          } catch (err) {
            if (err instanceof AgentConfigLockedError)
              await auditRefusal(
                deps,
                agentActor(agent.uid, req.id),
                'agent.config.write',
                agent.org_id,
                `agent:${agent.uid}`,
                `config key ${key} is locked at a broader scope`,
              );
            throw err;
          }
          return view.config(agent);
        },
      );
    });
  };
}
