import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { link, open, readFile, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Agent, request } from 'undici';
import { coalesced } from '../../core/coalesce.ts';
import { ApiError } from '../../core/errors.ts';
import type { Logger } from '../../core/logger.ts';
import { PROBLEMS } from '../../core/problem.ts';
import { formatSse, startSseResponse } from '../../core/sse.ts';
import { StreamGuard, streamGuardDeps } from '../../core/stream-guard.ts';
import { BrokerOptionsError } from '../errors.ts';
import { refusalOf, getAgent } from './agents.ts';
import { approvalSatelliteRoutes } from './approvals/satellite-routes.ts';
import type { ApprovalWaits } from './approvals/waits.ts';
import { auditRefusal } from './audit.ts';
import type { BrokerDeps } from './deps.ts';
import { satelliteSecrets, secretsVersion } from './secrets.ts';

// The satellites' routes on the agent listener (llmproxy, later the gateway), behind the satellite
// token (`Authorization: Bearer <token>`; anything else is a 401 Problem, an agent's JWT included):
//
//   GET  /v1/satellite/secrets                       {version, agents: {uid: {name: value}}, orgs: {org: {name: value}}}
//   GET  /v1/satellite/events                        SSE: `event: secrets` `data: {"version":N}` at once and
//                                                    after every change; `: heartbeat` every --heartbeat
//   POST /v1/satellite/agents/{uid}/operator-token   the control plane's agent-operator token for the agent
//   /v1/satellite/approvals…                         llmproxy's held tool calls (approvals/satellite-routes.ts)
//
// The token is the file --satellite-token-file (default <state-dir>/satellite-token), created 0600 with
// 32 random bytes on first start; co-located satellites read the same file. It is compared by its
// SHA-256 in constant time. The broker reads it at start: a new token takes a restart.

const SATELLITE_ACTOR = { subject: 'satellite', kind: 'service' };
/** What the control plane's answer to a mint may weigh; more is not a token. */
const MAX_MINT_ANSWER = 64 * 1024;

const sha256 = (s: string): Buffer => createHash('sha256').update(s).digest();

/**
 * The satellite token in `path`, created (0600, atomically: a half-written file is never seen, and of
 * two brokers starting together one token wins) when the file does not exist.
 */
export async function satelliteToken(path: string, log: Logger): Promise<string> {
  const read = async () => {
    const token = (await readFile(path, 'utf8')).trim();
    if (!token) throw new BrokerOptionsError(`the satellite token file ${path} is empty`);
    const mode = (await stat(path)).mode & 0o777;
    if (mode & 0o077)
      log.warn({ path, mode: mode.toString(8) }, 'the satellite token file is readable by others than its owner');
    return token;
  };
  try {
    return await read();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
      if (err instanceof BrokerOptionsError) throw err;
      throw new BrokerOptionsError(`cannot read the satellite token file ${path}`, { cause: err });
    }
  }
  const token = `dvxs_${randomBytes(32).toString('base64url')}`;
  const tmp = join(dirname(path), `.${basename(path)}.${randomBytes(8).toString('hex')}.tmp`);
  try {
    const file = await open(tmp, 'wx', 0o600);
    try {
      await file.writeFile(`${token}\n`);
      await file.sync();
    } finally {
      await file.close();
    }
    await link(tmp, path);
    log.info({ path }, 'satellite token created');
    return token;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return read();
    throw new BrokerOptionsError(`cannot create the satellite token file ${path}`, { cause: err });
  } finally {
    await rm(tmp, { force: true });
  }
}

export async function satelliteRoutes(
  deps: BrokerDeps,
  waits: ApprovalWaits,
): Promise<(app: FastifyInstance) => Promise<void>> {
  const { db, options, log } = deps;
  const expected = sha256(await satelliteToken(options.satelliteTokenFile, log));
  const ca = options.caCert
    ? await readFile(options.caCert).catch((err: unknown) => {
        throw new BrokerOptionsError(`cannot read --ca-cert ${options.caCert}`, { cause: err });
      })
    : undefined;
  const guardDeps = streamGuardDeps(deps.registry, log, 60_000, options.idleTimeout, 'broker');

  const authenticate = async (req: FastifyRequest) => {
    const header = req.headers.authorization;
    const token =
      typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : '';
    if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'missing satellite token');
    if (!timingSafeEqual(sha256(token), expected))
      throw new ApiError(PROBLEMS.unauthenticated, 'not the satellite token');
  };

  return async (app: FastifyInstance) => {
    app.addHook('onRequest', authenticate);
    const streams = new Set<StreamGuard>();
    const controlplane = options.controlplane
      ? {
          base: options.controlplane.replace(/\/+$/, ''),
          dispatcher: new Agent({
            connect: ca ? { ca } : {},
            headersTimeout: 10_000,
            bodyTimeout: 10_000,
          }),
        }
      : null;
    app.addHook('preClose', async () => {
      for (const guard of streams) guard.end('shutdown');
      await Promise.all([...streams].map((guard) => guard.settled()));
    });
    app.addHook('onClose', async () => {
      await controlplane?.dispatcher.close();
    });

    await app.register(approvalSatelliteRoutes(deps, waits));

    app.get('/v1/satellite/secrets', async (_req, reply) =>
      reply.header('cache-control', 'no-store').send(await satelliteSecrets(deps)),
    );

    app.get('/v1/satellite/events', async (req, reply) => {
      let latest = await secretsVersion(db);
      reply.hijack();
      const res = reply.raw;
      startSseResponse(res);
      const guard = new StreamGuard(
        // The token is the broker's for its whole life: nothing to re-check while the stream runs.
        { stream: 'satellite_events', res, expiresAt: null, recheck: async () => null },
        guardDeps,
      );
      streams.add(guard);
      // The newest version only: a client that reads slowly gets the last one, never a backlog.
      let sent = -1;
      const send = coalesced(
        async () => {
          const version = latest;
          if (version === sent) return;
          if (await guard.write(formatSse('secrets', { version }))) sent = version;
        },
        () => guard.stopped,
      );
      const onSecrets = (version: number) => {
        if (version > latest) latest = version;
        void send();
      };
      deps.bus.on('secrets', onSecrets);
      const heartbeat = setInterval(() => void guard.write(': heartbeat\n\n'), options.heartbeatMs);
      heartbeat.unref();
      res.on('close', () => {
        streams.delete(guard);
        deps.bus.off('secrets', onSecrets);
        clearInterval(heartbeat);
      });
      log.debug({ request_id: req.id }, 'satellite events stream opened');
      await send();
    });

    app.post('/v1/satellite/agents/:uid/operator-token', async (req, reply) => {
      const uid = (req.params as { uid: string }).uid;
      const agent = await getAgent(db, uid);
      if (!agent) throw new ApiError(PROBLEMS.notFound, `this enclave runs no agent ${uid}`);
      // Refused here, before the control plane is asked (spec: Agent operators, "Mint").
      const refusal = refusalOf(agent);
      if (refusal) {
        await auditRefusal(
          deps,
          { ...SATELLITE_ACTOR, traceId: String(req.id) },
          'agent-operator-token.mint',
          agent.org_id,
          `agent:${uid}`,
          refusal,
        );
        throw new ApiError(PROBLEMS.forbidden, `${refusal}: no agent-operator token is minted for it`);
      }
      if (!controlplane)
        throw new ApiError(
          PROBLEMS.controlPlaneNotConfigured,
          'this broker runs without --controlplane: agent-operator tokens come from the control plane',
        );
      return forward(reply, controlplane, uid, options.brokerKey, log);
    });
  };
}

/** The control plane's answer to the mint, relayed; 502 when it cannot be had or refuses the broker. */
async function forward(
  reply: FastifyReply,
  cp: { base: string; dispatcher: Agent },
  uid: string,
  brokerKey: string,
  log: Logger,
): Promise<FastifyReply> {
  let status: number;
  let type: string;
  let body: Buffer;
  try {
    const res = await request(`${cp.base}/v1/broker/agents/${encodeURIComponent(uid)}/operator-token`, {
      method: 'POST',
      dispatcher: cp.dispatcher,
      headers: { authorization: `Bearer ${brokerKey}` },
    });
    status = res.statusCode;
    const contentType = res.headers['content-type'];
    type = typeof contentType === 'string' ? contentType : 'application/json';
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body) {
      size += (chunk as Buffer).length;
      if (size > MAX_MINT_ANSWER) {
        res.body.destroy();
        throw new Error(`the control plane's answer exceeds ${MAX_MINT_ANSWER} bytes`);
      }
      chunks.push(chunk as Buffer);
    }
    body = Buffer.concat(chunks);
  } catch (err) {
    log.warn({ err, agent: uid }, 'agent-operator token: the control plane did not answer');
    throw new ApiError(PROBLEMS.controlPlaneUnavailable, 'the control plane did not answer');
  }
  // Its 401 is about the broker's key, not the satellite: the satellite cannot do anything about it.
  if (status === 401 || status >= 500) {
    log.warn({ agent: uid, status }, 'agent-operator token: the control plane refused');
    throw new ApiError(PROBLEMS.controlPlaneUnavailable, `the control plane answered ${status}`);
  }
  return reply.code(status).header('cache-control', 'no-store').type(type).send(body);
}
