import type { IncomingHttpHeaders } from 'node:http';
import { rootCertificates } from 'node:tls';
import { Agent, type Dispatcher } from 'undici';
import type { WireFormat } from '../../pipeline/policy/snapshot.ts';
import { isAnthropic } from './formats.ts';
import { GATEWAY_IDENTITY_HEADER } from './gateway-identity.ts';
import { decodeAnswers } from './interceptors/decode-answers.ts';
import { scrubHeaders } from './interceptors/scrub-headers.ts';

// The upstream side: one keep-alive undici Agent (a pool per origin) for every provider, trusting
// --upstream-ca in addition to the system roots when given, with the upstream concerns composed on it
// as undici interceptors (interceptors/). Its two timers bound a dead upstream (docs/decisions.md, "A
// dead upstream is cut, by two timers"): `headersTimeout` (--upstream-timeout) runs from the request's
// last byte sent to the answer's headers, `bodyTimeout` (--upstream-idle-timeout) between two chunks of
// the answer, an event stream's included, and never while the agent's side holds the stream back.

export const DEFAULT_UPSTREAMS: Record<WireFormat, string> = {
  'anthropic-messages': 'https://api.anthropic.com',
  'openai-chat': 'https://api.openai.com',
  'openai-responses': 'https://api.openai.com',
};

export function upstreamDispatcher(options: {
  ca?: Buffer;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
}): Dispatcher {
  const agent = new Agent({
    keepAliveTimeout: 30_000,
    connections: 256,
    pipelining: 1,
    headersTimeout: options.headersTimeoutMs,
    bodyTimeout: options.bodyTimeoutMs,
    // Node's `ca` replaces the system roots when given: they are joined, so a real provider still verifies.
    connect: options.ca ? { ca: [...rootCertificates, options.ca.toString('utf8')] } : undefined,
  });
  return agent.compose(scrubHeaders(), decodeAnswers());
}

/** Which of the dispatcher's timers cut an upstream call (`err` or its cause), or null for any other failure. */
export function upstreamTimeoutPhase(err: unknown): 'headers' | 'idle' | null {
  for (
    let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0;
    e && depth < 4;
    e = e.cause as typeof e, depth++
  ) {
    if (e.code === 'UND_ERR_HEADERS_TIMEOUT') return 'headers';
    if (e.code === 'UND_ERR_BODY_TIMEOUT') return 'idle';
  }
  return null;
}

// The few upstream bases in use, parsed once (URL parsing is a visible share of a call's CPU), with the
// path the call's own goes after (the base's, its trailing slashes dropped).
const TARGETS_KEPT = 256;
const targets = new Map<string, UpstreamTarget>();

export interface UpstreamTarget {
  readonly origin: string;
  /** The base URL's path without its trailing slashes ('' for a bare origin). */
  readonly basePath: string;
}

/** The parsed base URL of an upstream; throws TypeError on a malformed one as `new URL` does. */
export function upstreamTarget(base: string): UpstreamTarget {
  let target = targets.get(base);
  if (target === undefined) {
    const url = new URL(base);
    target = { origin: url.origin, basePath: url.pathname.replace(/\/+$/, '') };
    if (targets.size >= TARGETS_KEPT) targets.clear();
    targets.set(base, target);
  }
  return target;
}

// The agent's credentials never travel on: the upstream gets the real key (credentials.ts); nor does
// the gateway's identity header (it vouches to us, not to a provider), nor the content-length: the
// body leaving may differ (prefix, translation). Hop-by-hop headers and Accept-Encoding are the
// dispatcher's to drop (interceptors/scrub-headers.ts).
const AGENT_ONLY = new Set(['authorization', 'x-api-key', 'content-length', GATEWAY_IDENTITY_HEADER]);

/** Request headers for the upstream: the agent's, minus its credentials, plus the real key and length. */
export function upstreamHeaders(
  format: WireFormat,
  incoming: IncomingHttpHeaders,
  credential: string,
  bodyLength: number | null,
  translated = false,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of Object.keys(incoming)) {
    const value = incoming[name];
    if (value === undefined || AGENT_ONLY.has(name)) continue;
    // A translated call speaks the upstream's protocol: the other provider's headers stay behind.
    if (translated && (isAnthropic(format) ? name.startsWith('openai-') : name.startsWith('anthropic-'))) continue;
    out[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  if (translated && isAnthropic(format) && !out['anthropic-version']) out['anthropic-version'] = '2023-06-01';
  if (isAnthropic(format)) out['x-api-key'] = credential;
  else out.authorization = `Bearer ${credential}`;
  if (bodyLength !== null) out['content-length'] = String(bodyLength);
  return out;
}

/** An upstream answer whose body reads as plain bytes. */
export interface UpstreamAnswer {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: AsyncIterable<Buffer>;
  /** The content coding the upstream used although we asked for none, when the dispatcher cannot undo it. */
  unreadable: string | null;
}

/**
 * The answer as the dispatcher decoded it (interceptors/decode-answers.ts): a content coding still on
 * it is one we cannot undo, passed on as it came and reported in `unreadable`. Answers without a body
 * (to HEAD, 1xx, 204, 304) are left as they are.
 */
export function readableAnswer(answer: Dispatcher.ResponseData, method: string): UpstreamAnswer {
  const coding = String(answer.headers['content-encoding'] ?? '')
    .trim()
    .toLowerCase();
  const status = answer.statusCode;
  const bodiless = method === 'HEAD' || status < 200 || status === 204 || status === 304;
  return {
    statusCode: answer.statusCode,
    headers: answer.headers,
    body: answer.body as AsyncIterable<Buffer>,
    unreadable: coding === '' || coding === 'identity' || bodiless ? null : coding,
  };
}

const RESPONSE_DROP = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'trailer',
  'upgrade',
  'content-length',
]);

/** Response headers for the agent: the upstream's minus hop-by-hop ones. */
export function agentHeaders(
  upstream: Record<string, string | string[] | undefined>,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const name of Object.keys(upstream)) {
    const value = upstream[name];
    if (value === undefined || RESPONSE_DROP.has(name)) continue;
    out[name] = value;
  }
  return out;
}
