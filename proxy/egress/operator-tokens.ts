import { Agent, request } from 'undici';
import type { Logger } from '../../core/logger.ts';
import type { AgentIdentity } from '../llm/auth.ts';
import { OptionsError } from '../llm/errors.ts';
import { readSatelliteToken } from '../llm/secret-broker.ts';
import { readCaBundle, trusting } from './ca-bundle.ts';
import type { OperatorTokenSource } from './context.ts';
import { GatewayOptionsError, OperatorTokenError } from './errors.ts';
import { canonicalHost } from './host-match.ts';
import type { GatewayOptions } from './options.ts';

// Agent-operator tokens for --cp-api-host (spec: operator-api, "Agent operators": a 60-second token the
// enclave gateway presents on the agent's behalf; it never enters the agent's view). The broker mints
// them: `POST /v1/satellite/agents/{uid}/operator-token` with the satellite token; it refuses an agent
// it refuses itself (contained, suspended, isolated: 403, "refused at the mint") before it asks the
// control plane. A token is kept per agent until 10 s before it expires, so an agent's burst of
// requests costs one mint; concurrent requests of one agent wait for the same mint.
//
// The token is a credential: it goes in the forwarded request's Authorization and nowhere else (no
// log line, no error message).

/** Kept until this long before its expiry: time for the request that carries it to reach the control plane. */
const EXPIRY_MARGIN_MS = 10_000;
/** The mint's answer is small; more is not a token. */
const MAX_ANSWER_BYTES = 64 * 1024;
/** A mint (the broker, and through it the control plane) answers within this (or --upstream-timeout when shorter). */
const MINT_TIMEOUT_MS = 10_000;
/** Kept at most this long whatever the answer says (the spec's tokens live 60 s; --agent-token-ttl may differ). */
const MAX_KEPT_MS = 300_000;
/** Agents whose token is kept at once; past it, the one minted longest ago goes. */
const MAX_CACHED = 10_000;
/** What an Authorization header may carry (RFC 9110 token68 and the JWS alphabet): nothing that splits it. */
const TOKEN_SHAPE = /^[\x21-\x7e]{1,8192}$/;

interface Kept {
  token: string;
  /** ms epoch after which it is minted again. */
  renewAt: number;
}

/** `host` or `host:port` of --cp-api-host: the host as rules compare it, and the port (null: any). */
export function parseCpApiHost(value: string): { host: string; port: number | null } {
  const m = /^(.+?)(?::(\d{1,5}))?$/.exec(value.trim());
  const port = m?.[2] === undefined ? null : Number(m[2]);
  if (!m || (port !== null && (port < 1 || port > 65535)))
    throw new GatewayOptionsError(`--cp-api-host "${value}" must be a host name, optionally with :port`);
  return { host: canonicalHost(m[1]!), port };
}

export async function openOperatorTokens(options: GatewayOptions, log: Logger): Promise<OperatorTokenSource> {
  const api = parseCpApiHost(options.cpApiHost);
  let satellite: string;
  try {
    satellite = await readSatelliteToken(options.secretBrokerTokenFile);
  } catch (err) {
    if (err instanceof OptionsError) throw new GatewayOptionsError(err.message, { cause: err });
    throw err;
  }
  const ca = await readCaBundle(options.brokerCa, '--broker-ca');
  const deadline = Math.min(options.upstreamTimeout, MINT_TIMEOUT_MS);
  const dispatcher = new Agent({
    keepAliveTimeout: 30_000,
    connect: { timeout: Math.min(options.connectTimeout, deadline), ...trusting(ca) },
    headersTimeout: deadline,
    bodyTimeout: deadline,
  });
  const base = options.secretBrokerUrl;
  const kept = new Map<string, Kept>();
  const minting = new Map<string, Promise<string>>();
  let closed = false;
  let closing: Promise<void> | null = null;

  async function mint(uid: string): Promise<string> {
    const url = `${base}/v1/satellite/agents/${encodeURIComponent(uid)}/operator-token`;
    let status: number;
    let body: Buffer;
    try {
      const res = await request(url, {
        method: 'POST',
        dispatcher,
        headers: { authorization: `Bearer ${satellite}` },
        signal: AbortSignal.timeout(deadline),
      });
      status = res.statusCode;
      body = await readBounded(res.body);
    } catch (err) {
      log.warn({ err, agent_id: uid }, 'agent-operator token: the broker did not answer');
      throw new OperatorTokenError('the broker did not answer the agent-operator token mint', null, { cause: err });
    }
    if (status !== 200) {
      const detail = problemDetail(body);
      log.warn({ agent_id: uid, status, detail }, 'agent-operator token: the broker refused the mint');
      throw new OperatorTokenError(
        status === 403
          ? `the agent-operator token is refused for agent ${uid}${detail ? `: ${detail}` : ''}`
          : `the broker answered ${status} to the agent-operator token mint${detail ? `: ${detail}` : ''}`,
        status,
      );
    }
    const answer = tokenAnswer(body);
    if (!answer) {
      log.warn({ agent_id: uid }, 'agent-operator token: the broker answered something that is not a token');
      throw new OperatorTokenError('the broker answered the agent-operator token mint with no usable token', null);
    }
    const renewAt = Date.now() + Math.min(answer.expiresIn * 1000 - EXPIRY_MARGIN_MS, MAX_KEPT_MS);
    if (!closed && renewAt > Date.now()) {
      if (kept.size >= MAX_CACHED) {
        const now = Date.now();
        for (const [id, k] of kept) if (k.renewAt <= now) kept.delete(id);
        if (kept.size >= MAX_CACHED) kept.delete(kept.keys().next().value!);
      }
      kept.delete(uid); // re-inserted last: the map's order is the order of minting
      kept.set(uid, { token: answer.token, renewAt });
    }
    log.debug({ agent_id: uid, expires_in: answer.expiresIn }, 'agent-operator token minted');
    return answer.token;
  }

  return {
    matches: (host, port) => canonicalHost(host) === api.host && (api.port === null || api.port === port),
    token(identity: AgentIdentity): Promise<string> {
      if (closed) return Promise.reject(new OperatorTokenError('the gateway is shutting down', null));
      const uid = identity.agentId;
      const hit = kept.get(uid);
      if (hit) {
        if (Date.now() < hit.renewAt) return Promise.resolve(hit.token);
        kept.delete(uid);
      }
      let pending = minting.get(uid);
      if (!pending) {
        pending = mint(uid).finally(() => minting.delete(uid));
        minting.set(uid, pending);
      }
      return pending;
    },
    close() {
      closed = true;
      kept.clear();
      closing ??= dispatcher.close();
      return closing;
    },
  };
}

async function readBounded(body: AsyncIterable<unknown> & { destroy(): unknown }): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > MAX_ANSWER_BYTES) {
      body.destroy();
      throw new Error(`the broker's answer exceeds ${MAX_ANSWER_BYTES} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** The token of the mint's answer `{access_token, token_type: Bearer, expires_in}`, or null. */
function tokenAnswer(body: Buffer): { token: string; expiresIn: number } | null {
  let doc: unknown;
  try {
    doc = JSON.parse(body.toString('utf8'));
  } catch {
    return null; // not JSON: no token (the caller refuses the request and logs it)
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) return null;
  const { access_token: token, token_type: type, expires_in: expiresIn } = doc as Record<string, unknown>;
  if (typeof token !== 'string' || !TOKEN_SHAPE.test(token)) return null;
  if (typeof type !== 'string' || type.toLowerCase() !== 'bearer') return null;
  if (typeof expiresIn !== 'number' || !Number.isFinite(expiresIn) || expiresIn <= 0) return null;
  return { token, expiresIn };
}

/** A Problem's `detail` (the broker's words for a refusal), bounded; empty when there is none. */
function problemDetail(body: Buffer): string {
  try {
    const doc = JSON.parse(body.toString('utf8')) as { detail?: unknown } | null;
    return typeof doc?.detail === 'string' ? doc.detail.slice(0, 300) : '';
  } catch {
    return ''; // not a Problem: the status says it
  }
}
