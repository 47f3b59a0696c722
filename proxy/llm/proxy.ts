import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import { BodyTooLargeError } from '../../pipeline/errors.ts';
import { CallContext, type ProxyDeps, type Step } from './context.ts';
import { ERRORS, Refusal, type ProxyError } from './errors.ts';
import { agentStanding } from './agent-standing.ts';
import { admit } from './steps/admit.ts';
import { appendRecord } from './steps/audit.ts';
import { authenticate } from './steps/authenticate.ts';
import { credential } from './steps/credential.ts';
import { forward } from './steps/forward.ts';
import { inspectRequest } from './steps/inspect-request.ts';
import { modelPolicy, providerPolicy } from './steps/llm-policy.ts';
import { prefix } from './steps/prefix.ts';
import { readBody, releaseBody } from './steps/read-body.ts';
import { refusedResults } from './steps/refused-results.ts';
import { relay } from './steps/relay.ts';
import { route } from './steps/route.ts';
import { toolPolicy } from './steps/tool-policy.ts';
import { translate } from './steps/translate.ts';

export type { ProxyDeps } from './context.ts';

// One agent call, as steps (proxy/llm/steps/, one per file; docs/decisions.md, "The request path as
// steps"), each reading and filling the call's context (context.ts):
//
//   authenticate ─▶ admit (agent state, tier, governance) ─▶ route ─▶ provider policy
//     ─▶ read body (≤ 32 MB) ─▶ [translate] ─▶ refused results (a server-held conversation's refused
//        tool calls answered: steps/refused-results.ts) ─▶ prefix ─▶ model policy (governance llm_policy: 403)
//     ─▶ inspect request (403 block │ 503 fail-closed) ─▶ credential
//     ─▶ tool policy (the call's Decide for its answer's tool calls, or none) ─▶ forward (undici)
//     ─▶ relay: stream    events pass through as they arrive [translated], a copy feeds the response
//                         pipeline at the end; the final event waits for the audit record
//               plain     held, response pipeline (observe-only), [translated], audit record, then
//                         replayed byte for byte
//               other     passed through as it arrives, a copy inspected at the end
//     ─▶ audit record (steps/audit.ts): always written before the answer's last byte leaves
//
// A step that refuses throws a Refusal (errors.ts), turned here, in one place, into the answer and the
// call's record. This file is the list, the runner and the lifecycle (drain, calls in flight, and the
// re-check of open calls on each snapshot reload: `recheck`).

const STEPS: readonly Step[] = [
  authenticate,
  admit,
  route,
  providerPolicy,
  readBody,
  translate,
  refusedResults,
  prefix,
  modelPolicy,
  inspectRequest,
  credential,
  toolPolicy,
  forward,
  relay,
];

const HEALTH_PATH = '/healthz';
const CLOSE = { connection: 'close' };

export class LlmProxy {
  #d: ProxyDeps;
  #inFlight = 0;
  /** The calls in flight (the reload's re-check reads their agents). */
  readonly #open = new Set<CallContext>();
  #idle: (() => void) | null = null;
  #draining = false;
  #drained = false;

  constructor(deps: ProxyDeps) {
    this.#d = deps;
  }

  get inFlight(): number {
    return this.#inFlight;
  }

  /**
   * Resolves when the calls in flight have finished. The listener no longer accepts connections (the
   * server's close); a call that still arrives on a connection already open is served, with
   * `connection: close`, so its client opens its next connection elsewhere: another worker during a
   * rolling restart (cli/serve-workers.ts), not a 503. Each open connection carries at most one such call.
   */
  drain(): Promise<void> {
    this.#draining = true;
    if (this.#inFlight === 0) {
      this.#drained = true;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      this.#idle = () => {
        this.#idle = null;
        this.#drained = true;
        resolve();
      };
    });
  }

  handle = (req: IncomingMessage, res: ServerResponse): void => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === HEALTH_PATH && (req.method === 'GET' || req.method === 'HEAD')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      const status = this.#draining ? 'draining' : 'ok';
      res.end(JSON.stringify({ component: 'llmproxy', status, version: this.#d.version }));
      return;
    }
    if (this.#draining) {
      // Past the drain (nothing in flight any more) the connections are being cut: refuse, and say so.
      if (this.#drained) {
        send(res, ERRORS.shuttingDown, CLOSE);
        req.resume();
        return;
      }
      res.shouldKeepAlive = false;
    }
    this.#inFlight++;
    void this.#run(new CallContext(this.#d, req, res, path));
  };

  /**
   * Every open call checked again against the snapshot now current (the proxy calls this on each
   * reload): an admitted call whose agent is now contained, suspended, isolated, in another org or
   * removed is cut, as the gateway cuts its open flows (docs/decisions.md, "A reload reaches llmproxy's
   * open calls"). A credential's expiry cuts nothing already admitted.
   */
  readonly recheck = (): void => {
    if (this.#open.size === 0) return;
    const d = this.#d;
    const snapshot = d.snapshot();
    d.removed.observe(snapshot);
    for (const ctx of [...this.#open]) {
      if (!ctx.admitted || ctx.cut !== null || ctx.res.writableFinished) continue;
      const standing = agentStanding(snapshot, ctx.identity!, d.removed);
      if (standing.refused) cut(ctx, `policy changed: ${standing.reason}`);
    }
  };

  async #run(ctx: CallContext): Promise<void> {
    this.#open.add(ctx);
    try {
      for (const step of STEPS) {
        // A step that finishes at once costs no turn of the event loop.
        const pending = step(ctx);
        if (pending !== undefined) await pending;
        if (ctx.cut !== null) throw new Refusal(ERRORS.agentRefused, ctx.cut);
      }
    } catch (err) {
      this.#failed(ctx, err as Error);
    } finally {
      this.#open.delete(ctx);
      finish(ctx);
      if (--this.#inFlight === 0 && this.#idle) this.#idle();
    }
  }

  /** The one place a call that did not end in a relayed answer gets its answer and its record. */
  #failed(ctx: CallContext, err: Error): void {
    const { req, res } = ctx;
    // A cut call ends as its cut says, whatever the cut made the step that was running see (an aborted
    // upstream, a closed response).
    if (ctx.cut !== null && !(err instanceof Refusal && err.answer === ERRORS.agentRefused))
      err = new Refusal(ERRORS.agentRefused, ctx.cut);
    if (err instanceof Refusal) {
      // A refusal before the body is read drains it, so the connection stays usable.
      if (!ctx.reading) req.resume();
      if (res.headersSent) res.destroy();
      else answer(ctx, err.answer, err.reason, err.headers);
      return;
    }
    ctx.error = err.message;
    if (err instanceof BodyTooLargeError && !res.headersSent) {
      answer(ctx, ERRORS.tooLarge, err.message, CLOSE);
      return;
    }
    this.#d.log.error({ err, request_id: ctx.id }, 'llmproxy call failed');
    if (!res.headersSent) answer(ctx, ERRORS.upstreamFailed, null, null);
    else res.destroy();
  }
}

/**
 * An answer of our own; its record (a refusal's findings above all) is appended before it leaves. A
 * refusal of ours (`reason` given) is recorded with decision `deny` and its reason in `error`.
 */
function answer(
  ctx: CallContext,
  error: ProxyError,
  reason: string | null,
  headers: Record<string, string> | null,
): void {
  if (reason !== null) {
    ctx.decision = 'deny';
    ctx.error = reason;
  }
  ctx.status = error.status;
  appendRecord(ctx);
  send(ctx.res, error, headers);
}

function send(res: ServerResponse, error: ProxyError, headers: Record<string, string> | null): void {
  const length = String(error.body.length);
  res.writeHead(error.status, { 'content-type': error.contentType, 'content-length': length, ...headers });
  res.end(error.body);
}

/**
 * Ends an open call a reload refused: not answered yet, its upstream call is aborted and the runner
 * answers 403 after the step that is running; answering, its response is destroyed (a stream is cut
 * before its final event, so no SDK takes it for complete). Its record is `deny` with the reason.
 */
function cut(ctx: CallContext, reason: string): void {
  ctx.cut = reason;
  ctx.d.log.warn(
    { request_id: ctx.id, agent_id: ctx.identity?.agentId, reason },
    'open call cut: the policy snapshot now refuses its agent',
  );
  ctx.d.metrics.callsCut.inc();
  ctx.upstreamAbort.abort();
  if (ctx.res.headersSent) ctx.res.destroy();
}

function finish(ctx: CallContext): void {
  const d = ctx.d;
  if (ctx.cut !== null) {
    ctx.decision = 'deny';
    ctx.error = ctx.cut;
  }
  releaseBody(ctx);
  const totalMs = performance.now() - ctx.started;
  const format = ctx.format ?? 'unknown';
  d.metrics.requests.inc({ format, status: String(ctx.status) });
  d.metrics.overhead.observe({ format }, Math.max(0, totalMs - (ctx.upstreamMs ?? 0)) / 1000);
  if (ctx.format) d.metrics.responseBytes.observe({ format }, ctx.responseBytes);
  appendRecord(ctx);
}
