import type { IncomingHttpHeaders } from 'node:http';
import { pipeline, Readable, type Transform } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate, createInflateRaw, createZstdDecompress } from 'node:zlib';
import { Agent, type Dispatcher } from 'undici';
import type { WireFormat } from '../../pipeline/policy/snapshot.ts';
import { isAnthropic } from './formats.ts';
import { scrubHeaders } from './interceptors/scrub-headers.ts';
import { own } from '../../core/own.ts';

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

export function upstreamDispatcher(options: { ca?: Buffer; headersTimeoutMs: number; bodyTimeoutMs: number }): Dispatcher {
  const agent = new Agent({
    keepAliveTimeout: 30_000,
    connections: 256,
    pipelining: 1,
    headersTimeout: options.headersTimeoutMs,
    bodyTimeout: options.bodyTimeoutMs,
    connect: options.ca ? { ca: options.ca } : undefined,
  });
  return agent.compose(scrubHeaders());
}

/** Which of the dispatcher's timers cut an upstream call (`err` or its cause), or null for any other failure. */
export function upstreamTimeoutPhase(err: unknown): 'headers' | 'idle' | null {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; e = e.cause as typeof e, depth++) {
    if (e.code === 'UND_ERR_HEADERS_TIMEOUT') return 'headers';
    if (e.code === 'UND_ERR_BODY_TIMEOUT') return 'idle';
  }
  return null;
}

// The few upstream bases in use, parsed once (URL parsing is a visible share of a call's CPU).
const TARGETS_KEPT = 256;
const targets = new Map<string, URL>();

/** The parsed base URL of an upstream; throws TypeError on a malformed one as `new URL` does. */
export function upstreamTarget(base: string): URL {
  let target = targets.get(base);
  if (target === undefined) {
    target = new URL(base);
    if (targets.size >= TARGETS_KEPT) targets.clear();
    targets.set(base, target);
  }
  return target;
}

// The agent's credentials never travel on: the upstream gets the real key (credentials.ts); nor does
// its content-length: the body leaving may differ (prefix, translation). Hop-by-hop headers and
// Accept-Encoding are the dispatcher's to drop (interceptors/scrub-headers.ts).
const AGENT_ONLY = new Set(['authorization', 'x-api-key', 'content-length']);

/** Request headers for the upstream: the agent's, minus its credentials, plus the real key and length. */
export function upstreamHeaders(
  format: WireFormat, incoming: IncomingHttpHeaders, credential: string, bodyLength: number | null, translated = false,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(incoming)) {
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
  /** The content coding the upstream used although we asked for none, when we cannot undo it. */
  unreadable: string | null;
}

// zlib-wrapped deflate (RFC 9110 says "deflate" is that) or, as some servers send it, raw deflate.
const inflate = (first: Buffer) => (first.length >= 2 && (first[0] & 0x0f) === 8 && ((first[0] << 8) | first[1]) % 31 === 0 ? createInflate() : createInflateRaw());
const DECODERS: Record<string, (first: Buffer) => Transform> = {
  gzip: () => createGunzip(), 'x-gzip': () => createGunzip(), deflate: inflate, br: () => createBrotliDecompress(), zstd: () => createZstdDecompress(),
};

/**
 * The body with a content coding undone. The first two bytes pick the decoder where the coding's name
 * is ambiguous, and an empty body stays empty (zlib refuses empty input). The decoder is pulled as the
 * reader reads, so a small compressed answer never inflates faster than it is consumed. A corrupt body
 * errors the loop reading it.
 */
async function* decoded(source: AsyncIterable<Buffer>, make: (first: Buffer) => Transform): AsyncIterable<Buffer> {
  const it = source[Symbol.asyncIterator]();
  let head: Buffer = Buffer.alloc(0);
  let ended = false;
  while (head.length < 2) {
    const next = await it.next();
    if (next.done) {
      ended = true;
      break;
    }
    head = head.length === 0 ? next.value : Buffer.concat([head, next.value]);
  }
  if (head.length === 0) return;
  async function* input(): AsyncIterable<Buffer> {
    yield head;
    if (ended) return;
    for (;;) {
      const next = await it.next();
      if (next.done) return;
      yield next.value;
    }
  }
  const decoder = make(head);
  const output = pipeline(Readable.from(input()), decoder, () => {});
  try {
    for await (const chunk of output as AsyncIterable<Buffer>) yield chunk;
  } finally {
    decoder.destroy();
    await it.return?.();
  }
}

/**
 * The answer with its content coding undone, for an upstream that compresses although we asked for
 * `identity`. The agent then gets the plain bytes (the coding's header is dropped). A coding we do not
 * know is passed on as it came and reported in `unreadable`. Answers without a body (to HEAD, 1xx,
 * 204, 304) are left as they are.
 */
export function readableAnswer(answer: Dispatcher.ResponseData, method: string): UpstreamAnswer {
  const coding = String(answer.headers['content-encoding'] ?? '').trim().toLowerCase();
  const plain = { statusCode: answer.statusCode, headers: answer.headers, body: answer.body as AsyncIterable<Buffer>, unreadable: null };
  const bodiless = method === 'HEAD' || answer.statusCode < 200 || answer.statusCode === 204 || answer.statusCode === 304;
  if (coding === '' || coding === 'identity' || bodiless) return plain;
  const make = own(DECODERS, coding);
  if (!make) return { ...plain, unreadable: coding };
  const headers = { ...answer.headers };
  delete headers['content-encoding'];
  return { statusCode: answer.statusCode, headers, body: decoded(answer.body as AsyncIterable<Buffer>, make), unreadable: null };
}

const RESPONSE_DROP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'trailer', 'upgrade', 'content-length']);

/** Response headers for the agent: the upstream's minus hop-by-hop ones. */
export function agentHeaders(upstream: Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(upstream)) {
    if (value === undefined || RESPONSE_DROP.has(name)) continue;
    out[name] = value;
  }
  return out;
}
