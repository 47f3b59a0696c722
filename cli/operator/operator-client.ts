import { Agent, type Dispatcher, request } from 'undici';
import { CliError, ProblemAnswerError } from '../errors.ts';
import {
  EXIT_CONFLICT,
  EXIT_NOT_FOUND,
  EXIT_REFUSED,
  EXIT_REJECTED,
  EXIT_UNAVAILABLE,
  EXIT_USAGE,
} from '../exit-codes.ts';
import { type TokenSource, tokenSource } from './bearer-token.ts';
import type { ClientSettings } from './client-options.ts';
import { printable, problemLine } from './output.ts';

// One operator call: the bearer token, the TLS trust the options name, bounded time, and the answer
// turned into data or into one clear error whose exit code says its class (exit-codes.ts).

export type Target = 'controlplane' | 'broker';

export interface CallSpec {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** Path under the target's base URL, segments already encoded (use `path` below). */
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  target?: Target;
  headers?: Record<string, string>;
}

export interface CallAnswer<T = unknown> {
  status: number;
  body: T;
  headers: Record<string, string | string[] | undefined>;
}

/** A non-2xx answer: `dvx: <status> <title>: <detail>` and its class's exit code. */
export function problemAnswer(status: number, body: unknown): ProblemAnswerError {
  return new ProblemAnswerError(problemLine(status, body), exitCodeFor(status), status, body);
}

export function exitCodeFor(status: number): number {
  if (status === 401 || status === 403) return EXIT_REFUSED;
  if (status === 404) return EXIT_NOT_FOUND;
  if (status === 409 || status === 412) return EXIT_CONFLICT;
  if (status >= 400 && status < 500) return EXIT_REJECTED;
  return EXIT_UNAVAILABLE;
}

/** `path\`/orgs/${org}\`` with each interpolated value percent-encoded as one segment. */
export function path(strings: TemplateStringsArray, ...values: (string | number)[]): string {
  let out = strings[0];
  values.forEach((v, i) => {
    const s = String(v);
    if (s === '' || s === '.' || s === '..') throw new CliError(`"${s}" is not a valid name in a path`);
    out += encodeURIComponent(s) + strings[i + 1];
  });
  return out;
}

const HEADERS_TIMEOUT_MS = 30_000;
const MAX_ANSWER_BYTES = 64 * 1024 * 1024;
/**
 * One call, answer read to its end, at most this long: the per-chunk timeouts alone let a server that
 * sends a byte now and then hold a command forever. Streams (sse-follow.ts) are not calls.
 */
export const CALL_DEADLINE_MS = 5 * 60_000;

export class OperatorClient {
  readonly settings: ClientSettings;
  readonly dispatcher: Dispatcher;
  readonly tokens: TokenSource;

  readonly deadlineMs: number;

  constructor(settings: ClientSettings, options: { deadlineMs?: number } = {}) {
    this.settings = settings;
    this.deadlineMs = options.deadlineMs ?? CALL_DEADLINE_MS;
    this.dispatcher = new Agent({
      connect: settings.insecureSkipVerify ? { rejectUnauthorized: false } : settings.ca ? { ca: settings.ca } : {},
      headersTimeout: HEADERS_TIMEOUT_MS,
      bodyTimeout: HEADERS_TIMEOUT_MS,
    });
    this.tokens = tokenSource(settings, this.dispatcher);
  }

  /** The target's base URL, or a usage error naming the flag that is missing. */
  base(target: Target): string {
    const url = target === 'broker' ? this.settings.broker : this.settings.controlplane;
    if (!url)
      throw new CliError(
        target === 'broker'
          ? '--broker is required (the enclave broker operator listener), or a profile that holds it'
          : '--controlplane is required (the operator API), or a profile that holds it',
        EXIT_USAGE,
      );
    return url.replace(/\/+$/, '');
  }

  url(spec: Pick<CallSpec, 'path' | 'query' | 'target'>): string {
    const u = new URL(this.base(spec.target ?? 'controlplane') + spec.path);
    for (const [k, v] of Object.entries(spec.query ?? {})) if (v !== undefined) u.searchParams.set(k, String(v));
    return u.toString();
  }

  async call<T = unknown>(spec: CallSpec): Promise<CallAnswer<T>> {
    const url = this.url(spec);
    const token = await this.tokens.token();
    const headers: Record<string, string> = {
      accept: 'application/json',
      authorization: `Bearer ${token}`,
      ...spec.headers,
    };
    let body: string | undefined;
    if (spec.body !== undefined) {
      body = JSON.stringify(spec.body);
      headers['content-type'] = 'application/json';
    }
    const deadline = AbortSignal.timeout(this.deadlineMs);
    const late = () =>
      new CliError(`${url} did not answer within ${Math.round(this.deadlineMs / 1000)} s`, EXIT_UNAVAILABLE);
    let res: Dispatcher.ResponseData;
    try {
      res = await request(url, { method: spec.method, headers, body, dispatcher: this.dispatcher, signal: deadline });
    } catch (err) {
      if (deadline.aborted) throw late();
      throw unreachable(url, err);
    }
    let text: string;
    try {
      text = await readBounded(res);
    } catch (err) {
      if (deadline.aborted) throw late();
      throw err;
    }
    const type = String(res.headers['content-type'] ?? '');
    let parsed: unknown = text;
    if (/json/i.test(type) && text) {
      try {
        parsed = JSON.parse(text);
      } catch {
        if (res.statusCode < 300)
          throw new CliError(`${url} answered ${res.statusCode} with invalid JSON`, EXIT_UNAVAILABLE);
      }
    }
    if (res.statusCode >= 300) throw problemAnswer(res.statusCode, parsed);
    // Every answer of the operator API is JSON: a 2xx page of anything else is some other server (a wrong
    // URL, a captive portal, a proxy's page) and never the success it looks like.
    if (text.trim() !== '' && !/json/i.test(type))
      throw new CliError(
        `${url} answered ${res.statusCode} with ${printable(type.slice(0, 100)) || 'no content type'}, not JSON: is it the ${spec.target === 'broker' ? 'broker' : 'operator API'}?`,
        EXIT_UNAVAILABLE,
      );
    return { status: res.statusCode, body: (text === '' ? undefined : parsed) as T, headers: res.headers };
  }

  async close(): Promise<void> {
    await this.dispatcher.close().catch(() => {});
  }
}

async function readBounded(res: Dispatcher.ResponseData): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of res.body) {
    size += (chunk as Buffer).length;
    if (size > MAX_ANSWER_BYTES) {
      res.body.destroy();
      throw new CliError(`the answer is larger than ${MAX_ANSWER_BYTES} bytes`, EXIT_UNAVAILABLE);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** A call that got no answer: the cause in words an operator can act on. */
export function unreachable(url: string, err: unknown): CliError {
  const e = err as NodeJS.ErrnoException & { cause?: NodeJS.ErrnoException };
  const code = e.code ?? e.cause?.code ?? '';
  const origin = (() => {
    try {
      return new URL(url).origin;
    } catch {
      return url;
    }
  })();
  let why = e.message;
  if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS/i.test(code))
    why = `TLS certificate not trusted (${code}): give --ca-cert with the CA that issued it`;
  else if (code === 'ECONNREFUSED') why = 'connection refused (is it running?)';
  else if (code === 'ENOTFOUND') why = 'host not found';
  else if (/TIMEOUT/i.test(code)) why = `timed out (${code})`;
  return new CliError(`cannot reach ${origin}: ${why}`, EXIT_UNAVAILABLE, { cause: err });
}
