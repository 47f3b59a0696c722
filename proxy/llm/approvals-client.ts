import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request, type Dispatcher } from 'undici';
import type { Logger } from '../../core/logger.ts';
import { ApprovalRateLimitError, ApprovalsUnavailableError } from './errors.ts';
import { readSatelliteToken } from './secret-broker.ts';

// llmproxy's side of the broker's satellite approvals API (`--approvals-url`; docs/decisions.md,
// "Tool-call decisions: approvals, escalation and their record"), authenticated with the satellite token of
// `--secret-broker-token-file`, over TLS trusting `--broker-ca`:
//
//   POST /v1/satellite/approvals                 create → 201 approvalView (429: past the limits)
//   GET  /v1/satellite/approvals/{id}?wait=S     long-poll (S ≤ 30) until it is no longer pending
//   POST /v1/satellite/approvals/{id}/cancel     → 200 approvalView (cancelled), 409 once decided
//
// Every request is bounded in time and in the size of the answer read. A failure is a typed error
// (errors.ts): the caller denies the held call (fail closed). While waiting, a broker that does not
// answer or answers 5xx is asked again (backoff 250 ms doubling to 5 s) until the deadline: the
// approval lives on the broker, and a person may still decide it after a broker restart.

export const APPROVAL_STATUSES = ['pending', 'approved', 'denied', 'expired', 'cancelled'] as const;
export type ApprovalStatus = (typeof APPROVAL_STATUSES)[number];

/** What llmproxy sends to create an approval (COMMON contract). */
export interface ApprovalRequest {
  request_id: string;
  call_id: string;
  org_id: string;
  agent_id: string;
  agent_name: string;
  /** The request's model ('' when it named none). */
  model: string;
  tool: string;
  /** The redacted arguments, as JSON text (or the raw text when they do not parse); at most 16 KiB. */
  arguments: string;
  args_digest: string;
  rule: string | null;
  summary: string | null;
  policy_version: string;
  expires_in_ms: number;
}

/** The broker's approvalView, the fields llmproxy relies on checked. */
export interface ApprovalView {
  id: string;
  status: ApprovalStatus;
  args_digest: string;
  policy_version: string;
  reason: string | null;
  created_at: string;
  expires_at: string;
  decided_by: string | null;
  decided_at: string | null;
  [field: string]: unknown;
}

export interface ApprovalsClientOptions {
  /** The broker's agent base URL (https), without a trailing slash. */
  url: string;
  tokenFile: string;
  ca?: Buffer;
  log: Logger;
  /** Bound on one create or cancel, and on what a long poll may take past its wait. */
  requestTimeoutMs?: number;
  /** The longest long poll asked for (the broker serves at most 30 s). */
  maxWaitS?: number;
}

/** Far past any approvalView (the arguments are bounded by MAX_APPROVAL_ARGUMENTS_BYTES). */
const MAX_ANSWER_BYTES = 1024 * 1024;
/** The broker takes at most this much of arguments (UTF-8): larger ones are not sent, the call is denied. */
export const MAX_APPROVAL_ARGUMENTS_BYTES = 16 * 1024;
/** The broker's shortest expiry (`expires_in_ms` ≥ 1 s). */
export const MIN_APPROVAL_EXPIRY_MS = 1000;
const REQUEST_TIMEOUT_MS = 10_000;
const MAX_WAIT_S = 30;
const MAX_BACKOFF_MS = 5_000;

const isRecord = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const nullableString = (v: unknown): v is string | null => v === null || v === undefined || typeof v === 'string';

/** A broker's answer as an ApprovalView; throws naming what is wrong. */
export function parseApprovalView(doc: unknown): ApprovalView {
  if (!isRecord(doc)) throw new ApprovalsUnavailableError('the approval is not a JSON object');
  for (const f of ['id', 'args_digest', 'policy_version', 'created_at', 'expires_at'] as const)
    if (typeof doc[f] !== 'string') throw new ApprovalsUnavailableError(`the approval's ${f} is not a string`);
  if (!(APPROVAL_STATUSES as readonly unknown[]).includes(doc.status))
    throw new ApprovalsUnavailableError('the approval has no known status');
  for (const f of ['reason', 'decided_by', 'decided_at'] as const)
    if (!nullableString(doc[f])) throw new ApprovalsUnavailableError(`the approval's ${f} is not a string`);
  return {
    ...doc,
    reason: (doc.reason as string | undefined) ?? null,
    decided_by: (doc.decided_by as string | undefined) ?? null,
    decided_at: (doc.decided_at as string | undefined) ?? null,
  } as ApprovalView;
}

/** The answer's body as text, refused past MAX_ANSWER_BYTES. */
async function readBounded(body: Dispatcher.ResponseData['body']): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_ANSWER_BYTES) {
      body.destroy();
      throw new ApprovalsUnavailableError(`the broker's answer exceeds ${MAX_ANSWER_BYTES} bytes`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}

/** A Problem's detail (or title), for the error message; never more than a line. */
function problemText(text: string): string {
  try {
    const doc = JSON.parse(text) as { detail?: unknown; title?: unknown };
    const s = typeof doc.detail === 'string' ? doc.detail : typeof doc.title === 'string' ? doc.title : '';
    return s.slice(0, 200).replace(/[\r\n]+/g, ' ');
  } catch {
    return '';
  }
}

export class ApprovalsClient {
  readonly #o: Required<Omit<ApprovalsClientOptions, 'ca'>>;
  readonly #dispatcher: Agent;
  #token: string;

  /** Reads the token (a missing or empty file refuses the start); the broker is not asked until a call needs it. */
  static async open(o: ApprovalsClientOptions): Promise<ApprovalsClient> {
    return new ApprovalsClient(o, await readSatelliteToken(o.tokenFile));
  }

  private constructor(o: ApprovalsClientOptions, token: string) {
    this.#o = { requestTimeoutMs: REQUEST_TIMEOUT_MS, maxWaitS: MAX_WAIT_S, ...o };
    this.#token = token;
    this.#dispatcher = new Agent({ connect: o.ca ? { ca: o.ca } : {} });
  }

  /** Creates the approval. ApprovalRateLimitError on 429, ApprovalsUnavailableError on anything else not 201. */
  async create(body: ApprovalRequest, signal?: AbortSignal): Promise<ApprovalView> {
    const { status, text } = await this.#call('POST', '/v1/satellite/approvals', body, 0, signal);
    if (status === 201 || status === 200) return this.#view(text);
    if (status === 429) throw new ApprovalRateLimitError(problemText(text) || 'approval rate limit exceeded');
    throw this.#unexpected('POST /v1/satellite/approvals', status, text);
  }

  /** One long poll: the approval once it is no longer pending, or as it is after `waitS` seconds. */
  async get(id: string, waitS: number, signal?: AbortSignal): Promise<ApprovalView> {
    const wait = Math.max(0, Math.min(this.#o.maxWaitS, Math.ceil(waitS)));
    const path = `/v1/satellite/approvals/${encodeURIComponent(id)}?wait=${wait}`;
    const { status, text } = await this.#call('GET', path, undefined, wait * 1000, signal);
    if (status === 200) return this.#view(text);
    if (status >= 500)
      throw new ApprovalsUnavailableError(`the broker answered ${status} to GET ${path}`, { transient: true });
    throw this.#unexpected(`GET ${path}`, status, text);
  }

  /**
   * Long-polls until the approval is no longer pending, or `deadline` (performance.now() ms) passes:
   * then the last view seen (still pending). Transient failures are asked again until the deadline; an
   * abort rejects with the signal's reason.
   */
  async waitDecided(id: string, deadline: number, now: () => number, signal?: AbortSignal): Promise<ApprovalView> {
    let backoff = 250;
    let last: ApprovalView | null = null;
    let lastError: Error | null = null;
    for (;;) {
      signal?.throwIfAborted();
      const left = deadline - now();
      if (left <= 0) {
        if (last) return last;
        throw new ApprovalsUnavailableError(
          `no answer from the approval service before the escalation deadline${lastError ? `: ${lastError.message}` : ''}`,
          { cause: lastError },
        );
      }
      try {
        last = await this.get(id, left / 1000, signal);
        lastError = null;
        backoff = 250;
        if (last.status !== 'pending') return last;
        continue;
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        if (!(err instanceof ApprovalsUnavailableError) || !err.transient) throw err;
        lastError = err;
        this.#o.log.warn({ err, approval_id: id }, 'approval service did not answer a long poll; asking again');
      }
      await sleep(Math.min(backoff, Math.max(0, deadline - now())), undefined, { signal }).catch(() => {});
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  /** Cancels a pending approval: its view (`cancelled`), or null when it was decided first (409). */
  async cancel(id: string): Promise<ApprovalView | null> {
    const path = `/v1/satellite/approvals/${encodeURIComponent(id)}/cancel`;
    const { status, text } = await this.#call('POST', path, {}, 0);
    if (status === 200) return this.#view(text);
    if (status === 409) return null;
    throw this.#unexpected(`POST ${path}`, status, text);
  }

  async close(): Promise<void> {
    await this.#dispatcher.destroy();
  }

  #view(text: string): ApprovalView {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      throw new ApprovalsUnavailableError('the approval service answered something that is not JSON');
    }
    return parseApprovalView(doc);
  }

  #unexpected(what: string, status: number, text: string): ApprovalsUnavailableError {
    const detail = problemText(text);
    return new ApprovalsUnavailableError(`the broker answered ${status} to ${what}${detail ? `: ${detail}` : ''}`);
  }

  /**
   * One request, its answer read whole (bounded). A 401 reads the token file again (the broker's token
   * may have been replaced) and tries once more. Network failures and timeouts are an
   * ApprovalsUnavailableError, transient for a GET (the long poll asks again).
   */
  async #call(
    method: 'GET' | 'POST',
    path: string,
    body: unknown,
    extraMs: number,
    signal?: AbortSignal,
    retried = false,
  ): Promise<{ status: number; text: string }> {
    const timeout = this.#o.requestTimeoutMs + extraMs;
    let status: number;
    let text: string;
    try {
      const res = await request(`${this.#o.url}${path}`, {
        method,
        dispatcher: this.#dispatcher,
        headers: {
          authorization: `Bearer ${this.#token}`,
          accept: 'application/json',
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        headersTimeout: timeout,
        bodyTimeout: timeout,
        ...(signal ? { signal } : {}),
      });
      status = res.statusCode;
      text = await readBounded(res.body);
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (err instanceof ApprovalsUnavailableError) throw err;
      const message = `approval service unreachable: ${(err as Error).message}`;
      throw new ApprovalsUnavailableError(message, { cause: err, transient: method === 'GET' });
    }
    if (status === 401 && !retried) {
      try {
        this.#token = await readSatelliteToken(this.#o.tokenFile);
      } catch (err) {
        this.#o.log.error({ err }, 'approvals: the satellite token file cannot be read again');
      }
      return this.#call(method, path, body, extraMs, signal, true);
    }
    return { status, text };
  }
}
