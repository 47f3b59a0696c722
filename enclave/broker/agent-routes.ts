import type { FastifyInstance, FastifyRequest } from 'fastify';
import pkg from '../../package.json' with { type: 'json' };
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { ApiError } from '../../core/errors.ts';
import { PROBLEMS, sendProblem, type CatalogueEntry } from '../../core/problem.ts';
import type { Queryable } from '../../core/sql.ts';
import { AgentConfigLockedError, CsrInvalidError, PlatformJwtError } from '../errors.ts';
import { changeStatus, getAgent, lockAgent, refusalOf, type BrokerAgent } from './agents.ts';
import { auditedChange, auditRefusal, type BrokerActor } from './audit.ts';
import { pruneBootstrapTokens, redeemBootstrapToken, tokenHash } from './bootstrap-tokens.ts';
import type { BrokerDeps } from './deps.ts';
import { MAX_CSR_BYTES, type EnclaveCa } from './identity/enclave-ca.ts';
import { bearerToken, verifyPlatformJwt } from './identity/jwt.ts';
import {
  peekRefreshToken,
  pruneRefreshTokens,
  revokeAgentFamilies,
  rotate,
  startFamily,
} from './identity/refresh-tokens.ts';
import type { SigningKeys } from './identity/signing-keys.ts';

// The agent listener's routes (spec: llm-content-policy, enclave-side agent-facing routes; operator-api,
// States and transitions): the JWKS and discovery (no authentication), the bootstrap and renewal
// exchanges (a bootstrap token / a refresh token in the body), and the agent's own secrets and config
// (bearer platform JWT, verified against the broker's own keys). Every error is a Problem document.
//
// An exchange prepares its whole answer (JWT, certificate, secrets, config) before the transaction that
// uses its token, and that transaction is the last thing it does: a failure on the way leaves the token
// usable, so an agent is never left holding a spent token and nothing else (docs/decisions.md,
// "Agent exchanges"). Refusals are ApiErrors of core/problem.ts's catalogue; the errors of the identity
// modules are mapped onto it here, everything else goes to the server's handler (core/problems-plugin.ts).

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

export interface AgentRoutesOptions {
  /** How often spent tokens and dead families are deleted (default 10 minutes). */
  pruneEveryMs?: number;
}

const PRUNE_EVERY_MS = 10 * 60_000;

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

/** How deep a config value may nest: far past any config, well short of what recursion over it could take. */
const MAX_CONFIG_DEPTH = 64;

/** Whether `value` nests objects/arrays deeper than `max` levels, walked without recursion. */
function nestedDeeperThan(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth > max) return true;
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
  return false;
}

/** A name an agent may be served: satellite secrets carry a service prefix (`llmproxy:…`, `agent:llmproxy.…`). */
const agentSecretName = (name: string) => !name.includes(':');

const agentActor = (uid: string | null, traceId: string): BrokerActor => ({
  subject: uid ? `agent:${uid}` : 'agent:unknown',
  kind: 'agent',
  traceId,
});

export function agentRoutes(deps: BrokerDeps, identity: AgentIdentity, options: AgentRoutesOptions = {}) {
  const { keys, ca, view } = identity;
  const ttl = () => deps.options.refreshTtl;

  /** Refuses an exchange: the refusal is audited (it stands whatever happens to its record), then thrown. */
  async function refuse(
    req: FastifyRequest,
    action: string,
    agent: Pick<BrokerAgent, 'uid' | 'org_id'> | null,
    entry: CatalogueEntry,
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
    throw new ApiError(entry, reason);
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
    if (!uid)
      return refuse(req, 'agent.bootstrap', null, PROBLEMS.unauthenticated, 'unknown, used or expired bootstrap token');
    const agent = await getAgent(deps.db, uid);
    if (!agent)
      return refuse(
        req,
        'agent.bootstrap',
        null,
        PROBLEMS.unauthenticated,
        'the bootstrap token names no agent of this enclave',
      );
    const refusal = refusalOf(agent);
    if (refusal) return refuse(req, 'agent.bootstrap', agent, PROBLEMS.forbidden, refusal);
    const bundle = await prepare(agent, body.csr, now);
    let family: { familyId: string; token: string };
    try {
      family = await auditedChange(deps, agentActor(uid, req.id), 'agent.bootstrap', agent.org_id, async (tx) => {
        // The agent's row first (the order convergence takes too): a suspension committed meanwhile is
        // seen here, and the status written below never overwrites it.
        const current = await lockAgent(tx, uid);
        if ((await redeemBootstrapToken(tx, body.token, now)) !== uid)
          throw new ApiError(PROBLEMS.unauthenticated, 'bootstrap token already used');
        const refusedNow = current ? refusalOf(current) : `agent ${uid} is gone`;
        if (refusedNow) throw new ApiError(PROBLEMS.forbidden, refusedNow);
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
      if (err instanceof ApiError) return refuse(req, 'agent.bootstrap', agent, err.entry, err.message);
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
    if (!peek) return refuse(req, 'agent.refresh', null, PROBLEMS.unauthenticated, 'unknown or expired refresh token');
    const agent = await getAgent(deps.db, peek.uid);
    if (!agent)
      return refuse(
        req,
        'agent.refresh',
        null,
        PROBLEMS.unauthenticated,
        'the refresh token names no agent of this enclave',
      );
    if (peek.state === 'revoked')
      return refuse(req, 'agent.refresh', agent, PROBLEMS.unauthenticated, 'the refresh token family is revoked');
    if (peek.state === 'used') return replayed(req, agent, body.refresh_token, now);
    const refusal = refusalOf(agent);
    if (refusal) return refuse(req, 'agent.refresh', agent, PROBLEMS.forbidden, refusal);
    const bundle = await prepare(agent, body.csr, now);
    // A successful renewal changes no state an operator governs and is not audited; its refusals are.
    let next: string | typeof REPLAYED;
    try {
      next = await deps.db.transaction(async (tx) => {
        const current = await lockAgent(tx, agent.uid);
        const r = await rotate(tx, body.refresh_token, ttl(), now);
        if (r && 'replayed' in r) throw REPLAYED_SIGNAL;
        if (!r || !('ok' in r) || r.uid !== agent.uid)
          throw new ApiError(PROBLEMS.unauthenticated, 'the refresh token is no longer valid');
        const refusedNow = current ? refusalOf(current) : `agent ${agent.uid} is gone`;
        if (refusedNow) throw new ApiError(PROBLEMS.forbidden, refusedNow);
        return r.next;
      });
    } catch (err) {
      // Lost a race with a rotation of the same token: a replay after all (the rotation rolled back).
      if (err === REPLAYED_SIGNAL) next = REPLAYED;
      else if (err instanceof ApiError) return refuse(req, 'agent.refresh', agent, err.entry, err.message);
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
          const current = await lockAgent(tx, agent.uid);
          const r = await rotate(tx, token, ttl(), now);
          if (!r || !('replayed' in r))
            throw new ApiError(PROBLEMS.unauthenticated, 'the refresh token family is revoked');
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
      if (err instanceof ApiError) return refuse(req, 'agent.refresh', agent, err.entry, err.message);
      throw err;
    }
    deps.bus.emit('agent', agent.uid);
    deps.log.warn(
      { agent: agent.uid, org_id: agent.org_id, family_id: outcome.familyId, status: outcome.status },
      'refresh token replayed: its family is revoked',
    );
    throw new ApiError(
      PROBLEMS.conflict,
      `the refresh token was used before: its family is revoked and agent ${agent.uid} is ${outcome.status}`,
    );
  }

  const authenticated = new WeakMap<FastifyRequest, BrokerAgent>();
  const agentOf = (req: FastifyRequest) => authenticated.get(req)!;

  /** The bearer platform JWT, verified against the broker's keys; its agent known and not refused. */
  async function authenticate(req: FastifyRequest): Promise<void> {
    const token = bearerToken(req.headers.authorization);
    if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'a platform JWT is required (Authorization: Bearer)');
    const claims = await verifyPlatformJwt(keys, token, deps.now());
    const agent = await getAgent(deps.db, claims.sub);
    if (!agent || agent.org_id !== claims.org_id)
      throw new ApiError(PROBLEMS.unauthenticated, 'the token names no agent of this enclave');
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
      throw new ApiError(PROBLEMS.forbidden, refusal);
    }
    authenticated.set(req, agent);
  }

  /**
   * Every exchange leaves rows behind (a renewal every few minutes per agent): the tokens that expired
   * (a used refresh token is kept until then, to recognise its replay), used bootstrap tokens, and the
   * families left without a token go, so the tables hold what can still be presented.
   */
  async function prune(): Promise<void> {
    const now = deps.now();
    await pruneRefreshTokens(deps.db, now);
    await pruneBootstrapTokens(deps.db, now);
  }

  return async (app: FastifyInstance) => {
    let pruning: Promise<void> | null = null;
    const pruner = setInterval(() => {
      pruning ??= prune()
        .catch((err: unknown) => deps.log.warn({ err }, 'spent agent tokens could not be pruned; retrying later'))
        .finally(() => {
          pruning = null;
        });
    }, options.pruneEveryMs ?? PRUNE_EVERY_MS);
    pruner.unref();
    app.addHook('onClose', async () => {
      clearInterval(pruner);
      await pruning;
    });

    // The identity modules' errors as Problems; anything else to the server's handler.
    app.setErrorHandler((err: Error, req, reply) => {
      const entry =
        err instanceof PlatformJwtError
          ? PROBLEMS.unauthenticated
          : err instanceof CsrInvalidError
            ? PROBLEMS.badRequest
            : err instanceof AgentConfigLockedError
              ? PROBLEMS.conflict
              : err instanceof AuditUnavailableError
                ? PROBLEMS.auditUnavailable
                : null;
      if (!entry) throw err;
      return sendProblem(reply, entry, err.message, req.url.split('?')[0]);
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
        if (!Object.hasOwn(secrets, name)) throw new ApiError(PROBLEMS.notFound, `no secret ${name} for this agent`);
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
          // Serialising and storing it recurse over it: a value nested past any config is refused first.
          if (nestedDeeperThan(value, MAX_CONFIG_DEPTH))
            throw new ApiError(PROBLEMS.badRequest, `value: nested deeper than ${MAX_CONFIG_DEPTH} levels`);
          // PostgreSQL's jsonb cannot hold a NUL character: refused here rather than failing in the store.
          if (JSON.stringify(value).includes('\\u0000'))
            throw new ApiError(PROBLEMS.badRequest, 'value: must not contain a NUL character');
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
