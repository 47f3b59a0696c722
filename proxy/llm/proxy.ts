import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { performance } from 'node:perf_hooks';
import type { Dispatcher } from 'undici';
import type { Logger } from '../../core/logger.ts';
import { newId } from '../../core/ids.ts';
import { own } from '../../core/own.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { MAX_BODY_BYTES, DEFAULT_INLINE_THRESHOLD_BYTES, type InspectionEngine, type InspectionOutcome } from '../../pipeline/engine.ts';
import type { Finding, Phase } from '../../pipeline/finding.ts';
import { BodyTooLargeError } from '../../pipeline/errors.ts';
import { topLevelString } from '../../pipeline/json-view.ts';
import type { PolicyCache } from '../../pipeline/policy/cache.ts';
import { resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { orgFlag, policyLayers, resolveSnapshotSetting, snapshotAgent, type Snapshot, type WireFormat } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import { AuthError, type AgentAuthenticator, type AgentIdentity } from './auth.ts';
import { resolveCredential } from './credentials.ts';
import { ERRORS, badRequest, type ProxyError } from './errors.ts';
import { BodyShapeError, INFERENCE_ROUTES, injectPrefix, isNormalApiPath, passThroughFormat, securityContext } from './formats.ts';
import type { ProxyMetrics } from './metrics.ts';
import type { LlmProxyOptions } from './options.ts';
import { tierRank } from './options.ts';
import { readBody, TooLargeError } from './read-body.ts';
import type { SecretSource } from './secrets-file.ts';
import { closedForSendStall } from '../../core/server-limits.ts';
import { agentHeaders, DEFAULT_UPSTREAMS, readableAnswer, upstreamHeaders, upstreamTarget, upstreamTimeoutPhase, type UpstreamAnswer } from './upstream.ts';
import { usageOf } from './usage.ts';
import { FinalEventGuard } from './final-event.ts';
import { gated, type CaptureOptions } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { routeOf, StreamTranslator, translateRequest, translateResponse, TranslationError } from './translate/index.ts';

// One agent call, as small steps (STYLE.md rule 3):
//
//   auth ─▶ agent state + tier ─▶ route ─▶ body (≤ 32 MB) ─▶ [translate] ─▶ flags ─▶ policy
//     ─▶ security-context prefix ─▶ request pipeline (403 block │ 503 fail-closed) ─▶ credential
//     ─▶ upstream (undici)
//     ─▶ stream: events pass through as they arrive [translated], a copy feeds the response pipeline
//                at the end; the final event waits for the audit record
//        plain:  buffered, response pipeline (observe-only), [translated], audit record, then
//                replayed byte for byte
//     ─▶ audit record (llm_audit_log): always written before the answer's last byte leaves, so a
//        process killed after answering has its record (durable in the WAL, with capture-or-deny;
//        in the kernel's pipe or file on stdout)
//
// Tool-call policy (a later issue) will sit between the upstream response and the agent: plain
// responses are already held until inspected; streams pass through `#relayStream`, where a held
// tool_use block will be decided before it is written.

export interface ProxyDeps {
  options: LlmProxyOptions;
  auth: AgentAuthenticator;
  snapshot: () => Snapshot;
  policies: PolicyCache<ResolvedPolicy>;
  secrets: SecretSource;
  engine: InspectionEngine;
  dispatcher: Dispatcher;
  audit: AuditSink;
  log: Logger;
  metrics: ProxyMetrics;
  version: string;
  /** Answers wait for their record (audit, then replay); capture-or-deny only with a durable sink. */
  capture: Omit<CaptureOptions, 'log'>;
}

interface CallRecord {
  id: string;
  started: number;
  identity: AgentIdentity | null;
  format: WireFormat | null;
  /** Set when --translate converted the call to another wire format. */
  upstreamFormat: WireFormat | null;
  path: string;
  model: string | null;
  requestBytes: number;
  responseBytes: number;
  status: number;
  upstreamStatus: number | null;
  upstreamMs: number | null;
  findings: Finding[];
  failOpen: boolean;
  /** The inspectors that did not finish, each with its phase and why (the record's `inspection_failures`). */
  failures: InspectionFailure[];
  decision: string;
  usage: ReturnType<typeof usageOf>;
  audit: boolean;
  /** The record was already handed to the sink (before delivery). */
  audited: boolean;
  error: string | null;
}

/** An inspector that did not finish (`inspector: 'all'` when none could run: an unreadable answer). */
interface InspectionFailure {
  phase: Phase;
  inspector: string;
  reason: string;
}

const HEALTH_PATH = '/healthz';

export class LlmProxy {
  #d: ProxyDeps;
  #inFlight = 0;
  #idle: (() => void) | null = null;
  #draining = false;

  constructor(deps: ProxyDeps) {
    this.#d = deps;
  }

  get inFlight(): number {
    return this.#inFlight;
  }

  /** Refuses new calls and resolves when the ones in flight have finished. */
  drain(): Promise<void> {
    this.#draining = true;
    if (this.#inFlight === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#idle = resolve));
  }

  handle = (req: IncomingMessage, res: ServerResponse): void => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === HEALTH_PATH && (req.method === 'GET' || req.method === 'HEAD')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ component: 'llmproxy', status: this.#draining ? 'draining' : 'ok', version: this.#d.version }));
      return;
    }
    if (this.#draining) {
      this.#send(res, ERRORS.shuttingDown, { connection: 'close' });
      req.resume();
      return;
    }
    this.#inFlight++;
    const call: CallRecord = {
      id: newId(), started: performance.now(), identity: null, format: null, upstreamFormat: null, path, model: null, requestBytes: 0, responseBytes: 0,
      status: 0, upstreamStatus: null, upstreamMs: null, findings: [], failOpen: false, failures: [], decision: 'allow', usage: null, audit: false, audited: false, error: null,
    };
    this.#serve(req, res, call)
      .catch((err: Error) => {
        call.error = err.message;
        if (err instanceof BodyTooLargeError && !res.headersSent) {
          this.#refuse(res, call, ERRORS.tooLarge, err.message, { connection: 'close' });
          return;
        }
        this.#d.log.error({ err: err.message, request_id: call.id }, 'llmproxy call failed');
        if (!res.headersSent) this.#reply(res, call, ERRORS.upstreamFailed);
        else res.destroy();
      })
      .finally(() => {
        this.#finish(call);
        if (--this.#inFlight === 0 && this.#idle) this.#idle();
      });
  };

  async #serve(req: IncomingMessage, res: ServerResponse, call: CallRecord): Promise<void> {
    const d = this.#d;
    // 1. Who is calling.
    let identity: AgentIdentity;
    try {
      identity = await d.auth.authenticate(req.headers, req.socket as TLSSocket);
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      d.metrics.authFailures.inc({ reason: err.message.split(' ')[1] ?? 'invalid' });
      d.log.warn({ request_id: call.id, reason: err.message, path: call.path, agent_id: err.identity?.agentId, org_id: err.identity?.orgId }, 'agent authentication failed');
      req.resume();
      // A token the issuer signed names its agent even when refused (expired, say): audited as that
      // agent's. Without a verified signature nothing names the caller, and no org's log takes the
      // record (docs/decisions.md, "P7.10"): the log line and the metric above are its trace.
      if (err.identity) this.#identify(call, d.snapshot(), err.identity);
      return this.#refuse(res, call, ERRORS.unauthenticated, `agent authentication failed: ${err.message}`, { 'www-authenticate': 'Bearer' });
    }
    const snapshot = d.snapshot();
    const agent = snapshotAgent(snapshot, identity.agentId);
    if (agent) {
      if (agent.org_id !== identity.orgId) {
        d.log.warn({ request_id: call.id, agent_id: identity.agentId, token_org: identity.orgId, snapshot_org: agent.org_id }, 'agent org does not match the snapshot');
        req.resume();
        // Recorded in the log of the org that owns the agent id: that is where the refusal is read.
        this.#identify(call, snapshot, { ...identity, orgId: agent.org_id, agentName: identity.agentName || agent.name });
        return this.#refuse(res, call, ERRORS.agentRefused, `token org_id "${identity.orgId}" differs from the agent's org in the snapshot`);
      }
      identity = { ...identity, agentName: identity.agentName || agent.name, groupId: agent.group_id ?? identity.groupId };
    }
    this.#identify(call, snapshot, identity);
    if (agent && (agent.status === 'suspended' || agent.status === 'isolated' || agent.contained)) {
      d.log.warn({ request_id: call.id, agent_id: identity.agentId, status: agent.status, contained: agent.contained }, 'agent refused by its state');
      req.resume();
      return this.#refuse(res, call, ERRORS.agentRefused, agent.contained ? 'agent is contained' : `agent is ${agent.status}`);
    }
    if (tierRank(snapshot.enclave.isolation_class) < tierRank(d.options.minTier)) {
      req.resume();
      return this.#refuse(res, call, ERRORS.tierTooLow, `enclave isolation class ${snapshot.enclave.isolation_class} is below --min-tier ${d.options.minTier}`);
    }

    // 2. Which API.
    const inferenceFormat = req.method === 'POST' ? own(INFERENCE_ROUTES, call.path) : undefined;
    // Only the providers' /v1 APIs, in normal form (formats.ts: the platform key never travels to
    // `/v1/../admin`, and `/v1/messages/` is no way around the inference route's checks).
    if (!isNormalApiPath(call.path)) {
      req.resume();
      return this.#refuse(res, call, ERRORS.notFound, 'no such route (not a provider /v1 path in normal form)');
    }
    const coding = req.headers['content-encoding'];
    if (coding !== undefined && coding.trim().toLowerCase() !== 'identity') {
      req.resume();
      return this.#refuse(res, call, ERRORS.encodedBody, `content-encoding ${coding} refused`, { connection: 'close' });
    }
    const format = inferenceFormat ?? passThroughFormat(call.path, req.headers);
    call.format = format;

    const upstreamFormat = inferenceFormat && d.options.translate && format !== d.options.translateUpstreamFormat ? d.options.translateUpstreamFormat : format;
    const translated = upstreamFormat !== format;
    const prefix = securityContext({
      agentId: identity.agentId, agentName: identity.agentName, orgId: identity.orgId, enclaveName: d.options.enclaveName || snapshot.enclave.name,
    });

    // 3. The body (inference calls carry JSON; no content-type is read as JSON).
    const contentType = req.headers['content-type'];
    if (inferenceFormat && contentType !== undefined && !/^application\/(?:[\w.+-]*\+)?json\s*(?:;|$)/i.test(contentType)) {
      req.resume();
      return this.#refuse(res, call, ERRORS.unsupportedMediaType, `content-type ${contentType} refused`);
    }
    let body: Buffer;
    try {
      // Room for the prefix, JSON-escaped, plus the wrapper around it, so it is spliced in place.
      body = await readBody(req, MAX_BODY_BYTES, DEFAULT_INLINE_THRESHOLD_BYTES, inferenceFormat && !translated ? Buffer.byteLength(JSON.stringify(prefix)) + 64 : 0);
    } catch (err) {
      if (err instanceof TooLargeError) return this.#refuse(res, call, ERRORS.tooLarge, 'request body exceeds 32 MB', { connection: 'close' });
      throw err;
    }
    call.requestBytes = body.length;
    d.metrics.requestBytes.observe({ format }, body.length);

    // 4. Inference calls: translation (--translate), prefix, then the request pipeline over the final
    //    outbound body.
    if (translated) {
      call.upstreamFormat = upstreamFormat;
      try {
        body = translateRequest(format, upstreamFormat, body);
      } catch (err) {
        if (err instanceof TranslationError) return this.#refuse(res, call, badRequest(err.message), err.message);
        throw err;
      }
    }
    if (inferenceFormat) {
      try {
        body = injectPrefix(upstreamFormat, body, prefix);
      } catch (err) {
        if (err instanceof BodyShapeError) return this.#refuse(res, call, badRequest(err.message), err.message);
        throw err;
      }
      call.model = topLevelString(body, 'model');
      if (call.model === null) return this.#refuse(res, call, ERRORS.modelRequired, 'model: a string model is required');
    } else if (body.length > 0) {
      call.model = topLevelString(body, 'model');
    }
    // The request pipeline runs on every body that leaves for the provider: inference calls, and the
    // other routes that carry content (embeddings, count_tokens, batches, file uploads). A pass-through
    // body is inspected as sent; model restriction checks every model it names, anywhere in it
    // (pipeline/inspectors/named-models.ts; on a pool worker when the body is large).
    if (body.length > 0 && orgFlag(snapshot, identity.orgId, 'inspect:llm')) {
      const policy = await d.policies.get(identity.orgId, identity.agentId, () => resolvePolicy(policyLayers(snapshot, identity.orgId, identity.groupId, identity.agentId)));
      const outcome = await d.engine.inspect({
        body, phase: 'request', policy, secrets: d.secrets.agentSecrets(identity.agentId),
        identity: { agentId: identity.agentId, orgId: identity.orgId, agentName: identity.agentName },
        ...(inferenceFormat ? {} : { modelsAnywhere: { contentType: req.headers['content-type'] ?? null } }),
      });
      this.#noteOutcome(call, outcome, 'request');
      if (outcome.decision === 'block') return this.#reply(res, call, ERRORS.contentPolicy);
      if (outcome.decision === 'unavailable') return this.#reply(res, call, ERRORS.inspectionUnavailable);
    }

    // 5. The upstream credential.
    const mode = resolveSnapshotSetting(snapshot, 'credential_mode', identity.orgId, identity.groupId, identity.agentId) ?? 'platform';
    const credential = resolveCredential(mode, identity, req.headers, d.secrets);
    if (credential === null) return this.#refuse(res, call, ERRORS.noCredential, `no LLM API credential configured (credential_mode ${mode})`);

    // 6. Upstream.
    const base = resolveSnapshotSetting(snapshot, 'upstream', identity.orgId, identity.groupId, identity.agentId)?.[upstreamFormat]
      ?? resolveSnapshotSetting(snapshot, 'downstream_url', identity.orgId, identity.groupId, identity.agentId)
      ?? (d.options.upstreamDefault || DEFAULT_UPSTREAMS[upstreamFormat]);
    const target = upstreamTarget(base);
    const query = (req.url ?? '').includes('?') ? (req.url ?? '').slice((req.url ?? '').indexOf('?')) : '';
    const upstreamPath = target.pathname.replace(/\/+$/, '') + (translated ? routeOf(upstreamFormat) + query : (req.url ?? '/'));
    const sendsBody = req.method !== 'GET' && req.method !== 'HEAD';
    const upstreamStarted = performance.now();
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    let upstream: Dispatcher.ResponseData;
    try {
      upstream = await d.dispatcher.request({
        origin: target.origin,
        path: upstreamPath,
        method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
        headers: upstreamHeaders(upstreamFormat, req.headers, credential, sendsBody ? body.length : null, translated),
        body: sendsBody ? body : undefined,
        signal: abort.signal,
      });
    } catch (err) {
      call.upstreamMs = performance.now() - upstreamStarted;
      this.#upstreamFailed(call, err as Error, 'upstream request failed', target.origin);
      return this.#reply(res, call, ERRORS.upstreamFailed);
    }
    call.upstreamMs = performance.now() - upstreamStarted;
    call.upstreamStatus = upstream.statusCode;
    d.metrics.upstream.observe({ format }, call.upstreamMs / 1000);

    const answer = readableAnswer(upstream, req.method ?? 'GET');
    if (answer.unreadable !== null && orgFlag(snapshot, identity.orgId, 'inspect:llm')) {
      call.failOpen = true;
      call.failures.push({ phase: 'response', inspector: 'all', reason: 'content_coding' });
      d.log.warn({ request_id: call.id, content_encoding: answer.unreadable }, 'inspection failopen: the upstream answer is in a content coding we cannot read');
    }
    const responseType = String(answer.headers['content-type'] ?? '');
    if (responseType.startsWith('text/event-stream')) return this.#relayStream(res, call, answer, format, upstreamFormat);
    if (!inferenceFormat) return this.#relayPassThrough(res, call, answer);
    return this.#relayBuffered(res, call, answer, format, upstreamFormat);
  }

  /**
   * Other routes of the provider APIs (models, files, count_tokens, batches): streamed through as they
   * come; a copy feeds the response pipeline (observe-only) at the end, as for a stream.
   */
  async #relayPassThrough(res: ServerResponse, call: CallRecord, upstream: UpstreamAnswer): Promise<void> {
    call.status = upstream.statusCode;
    res.writeHead(upstream.statusCode, agentHeaders(upstream.headers));
    const copy: Buffer[] = [];
    let kept = 0;
    try {
      for await (const chunk of upstream.body) {
        call.responseBytes += chunk.length;
        if (kept + chunk.length <= MAX_BODY_BYTES) {
          copy.push(chunk);
          kept += chunk.length;
        }
        const sent = await send(res, chunk, this.#d.options.idleTimeout);
        if (sent !== 'sent') return this.#agentGone(call, res, sent);
      }
    } catch (err) {
      this.#upstreamFailed(call, err as Error, 'upstream response failed');
      res.destroy();
      return;
    }
    if (kept > 0) await this.#inspectResponse(call, Buffer.concat(copy, kept));
    // The end of the answer waits for its record, as a stream's final event does.
    const delivered = await this.#deliver(call, () => res.end());
    if (!delivered) res.destroy();
  }

  /** A plain response: held, inspected (observe-only), then replayed byte for byte. */
  async #relayBuffered(res: ServerResponse, call: CallRecord, upstream: UpstreamAnswer, format: WireFormat, upstreamFormat: WireFormat): Promise<void> {
    let body: Buffer;
    try {
      body = await collect(upstream.body);
    } catch (err) {
      this.#upstreamFailed(call, err as Error, 'upstream response failed mid-body');
      return this.#reply(res, call, ERRORS.upstreamFailed);
    }
    call.responseBytes = body.length;
    call.usage = usageOf(upstreamFormat, body, false);
    await this.#inspectResponse(call, body);
    let out = body;
    // Upstream errors are relayed as received; a successful translated answer goes back in the agent's format.
    if (upstreamFormat !== format && upstream.statusCode >= 200 && upstream.statusCode < 300) {
      try {
        out = translateResponse(upstreamFormat, format, body);
      } catch (err) {
        call.error = `response translation failed: ${(err as Error).message}`;
        this.#d.log.warn({ request_id: call.id, err: (err as Error).message }, 'response translation failed');
        return this.#reply(res, call, ERRORS.upstreamFailed);
      }
    }
    call.status = upstream.statusCode;
    // The whole answer is here: sent with its length (not chunked encoding), once its record is written.
    const delivered = await this.#deliver(call, () => res.writeHead(upstream.statusCode, { ...agentHeaders(upstream.headers), 'content-length': String(out.length) }));
    if (!delivered) return this.#reply(res, call, ERRORS.auditUnavailable);
    if (out.length <= SEND_PIECE_BYTES) {
      res.end(out);
      return;
    }
    // In pieces through send(), not one write: progress is a piece taken by the agent, so a slow reader
    // that keeps reading is never cut, however large the answer (one write completes only once the
    // agent has taken nearly all of it).
    for (let at = 0; at < out.length; at += SEND_PIECE_BYTES) {
      const sent = await send(res, out.subarray(at, at + SEND_PIECE_BYTES), this.#d.options.idleTimeout);
      if (sent !== 'sent') return this.#agentGone(call, res, sent);
    }
    res.end();
  }

  /** SSE: events go to the agent as they arrive; the same bytes feed the response pipeline at the end. */
  async #relayStream(res: ServerResponse, call: CallRecord, upstream: UpstreamAnswer, format: WireFormat, upstreamFormat: WireFormat): Promise<void> {
    call.status = upstream.statusCode;
    res.writeHead(upstream.statusCode, agentHeaders(upstream.headers));
    res.flushHeaders();
    const translator = upstreamFormat !== format ? new StreamTranslator(upstreamFormat, format) : null;
    const guard = call.audit ? new FinalEventGuard(format) : null;
    const copy: Buffer[] = [];
    let kept = 0;
    try {
      for await (const chunk of upstream.body) {
        call.responseBytes += chunk.length;
        if (kept + chunk.length <= MAX_BODY_BYTES) {
          copy.push(chunk);
          kept += chunk.length;
        }
        const translated = translator ? Buffer.from(translator.push(chunk)) : chunk;
        const out = guard ? guard.push(translated) : translated;
        const sent = out.length > 0 ? await send(res, out, this.#d.options.idleTimeout) : res.destroyed ? 'closed' : 'sent';
        if (sent !== 'sent') {
          this.#agentGone(call, res, sent);
          break;
        }
      }
    } catch (err) {
      // Headers are sent: the agent sees the stream cut short (its SDK raises), never a stream left open.
      this.#upstreamFailed(call, err as Error, 'upstream stream failed');
      res.destroy();
    }
    let tail = translator && !res.destroyed ? Buffer.from(translator.end()) : Buffer.alloc(0);
    if (guard) tail = Buffer.concat([guard.push(tail), guard.rest()]);
    const body = Buffer.concat(copy, kept);
    call.usage = usageOf(upstreamFormat, body, true);
    await this.#inspectResponse(call, body);
    if (res.destroyed) return;
    const delivered = await this.#deliver(call, () => {
      if (tail.length > 0) res.write(tail);
      res.end();
    });
    // The final event never leaves without its record: the agent sees a stream cut short.
    if (!delivered) res.destroy();
  }

  /**
   * Runs `send` (the answer leaving for the agent) once the call's audit record is appended (durable,
   * with a durable sink); false when capture-or-deny refused it.
   */
  async #deliver(call: CallRecord, send: () => void): Promise<boolean> {
    const capture = this.#d.capture;
    if (!call.audit || !call.identity) {
      send();
      return true;
    }
    call.audited = true;
    try {
      await gated(this.#d.audit, 'llm_audit_log', this.#record(call), send, { ...capture, log: this.#d.log });
      return true;
    } catch (err) {
      if (!(err instanceof AuditUnavailableError)) throw err;
      // The record went to the sink and may still land; the refusal is a record of its own, under a
      // derived id, so neither hides the other (a store keeps the first row of an id).
      call.error = err.message;
      call.status = ERRORS.auditUnavailable.status;
      this.#d.audit.append('llm_audit_log', { ...this.#record(call), id: `${call.id}.refused` }).catch((e: Error) => {
        this.#d.log.error({ request_id: call.id, err: e.message }, 'audit record of the refusal lost');
      });
      return false;
    }
  }

  /**
   * The agent's side of the answer ended before its last byte: the agent stopped reading (nothing taken
   * for --idle-timeout, by this call's own bound or the listener's, core/server-limits.ts) or left.
   * Said in the record; leaving the relay loop releases the upstream (undici's body is destroyed and
   * `abort` fires on the response's close), so no upstream connection waits on an agent that reads nothing.
   */
  #agentGone(call: CallRecord, res: ServerResponse, how: 'closed' | 'stalled'): void {
    const stalled = how === 'stalled';
    call.error = stalled
      ? `the agent stopped reading: none of the answer was taken for ${this.#d.options.idleTimeout} ms (--idle-timeout); answer cut after ${call.responseBytes} upstream bytes`
      : 'the agent closed the connection before the answer was delivered';
    if (stalled) this.#d.metrics.agentStalls.inc();
    this.#d.log.info({ request_id: call.id, agent_id: call.identity?.agentId, stalled }, call.error);
    res.destroy();
  }

  /**
   * An upstream failure, named in the call's record (`error`) and the log; a dead upstream cut by one of
   * the dispatcher's timers (upstream.ts) says which, and is counted.
   */
  #upstreamFailed(call: CallRecord, err: Error, what: string, upstream?: string): void {
    const d = this.#d;
    const phase = upstreamTimeoutPhase(err);
    if (phase !== null) d.metrics.upstreamTimeouts.inc({ phase });
    const reason = phase === 'headers' ? `no response headers within ${d.options.upstreamTimeout} ms (--upstream-timeout)`
      : phase === 'idle' ? `nothing received for ${d.options.upstreamIdleTimeout} ms (--upstream-idle-timeout)`
      : err.message;
    call.error = `${what}: ${reason}`;
    d.log.warn({ request_id: call.id, upstream, timeout: phase, err }, what);
  }

  async #inspectResponse(call: CallRecord, body: Buffer): Promise<void> {
    const identity = call.identity!;
    const snapshot = this.#d.snapshot();
    if (!orgFlag(snapshot, identity.orgId, 'inspect:llm')) return;
    const policy = await this.#d.policies.get(identity.orgId, identity.agentId, () => resolvePolicy(policyLayers(snapshot, identity.orgId, identity.groupId, identity.agentId)));
    try {
      const outcome = await this.#d.engine.inspect({
        body, phase: 'response', policy, secrets: this.#d.secrets.agentSecrets(identity.agentId),
        identity: { agentId: identity.agentId, orgId: identity.orgId, agentName: identity.agentName },
      });
      this.#noteOutcome(call, outcome, 'response');
    } catch (err) {
      call.failOpen = true;
      call.failures.push({ phase: 'response', inspector: 'all', reason: 'error' });
      this.#d.log.warn({ request_id: call.id, phase: 'response', err: (err as Error).message }, 'inspection failopen');
    }
  }

  #noteOutcome(call: CallRecord, outcome: InspectionOutcome, phase: Phase): void {
    for (const f of outcome.findings) call.findings.push(f);
    for (const f of outcome.failures) call.failures.push({ phase, inspector: f.inspector, reason: f.reason });
    if (outcome.failOpen) call.failOpen = true;
    if (outcome.decision !== 'allow') call.decision = outcome.decision;
    if (outcome.findings.length > 0) {
      this.#d.log.info({ request_id: call.id, agent_id: call.identity?.agentId, findings: outcome.findings, decision: outcome.decision }, 'inspection findings');
    }
  }

  #send(res: ServerResponse, error: ProxyError, extra: Record<string, string> = {}): void {
    res.writeHead(error.status, { 'content-type': error.contentType, 'content-length': String(error.body.length), ...extra });
    res.end(error.body);
  }

  /** The call is that agent's from here on: its record goes to its org's log, if the org audits. */
  #identify(call: CallRecord, snapshot: Snapshot, identity: AgentIdentity): void {
    call.identity = identity;
    call.audit = orgFlag(snapshot, identity.orgId, 'audit:llm');
  }

  /**
   * A refusal of our own before anything reaches the upstream: recorded (once an identity is known, as
   * every refusal is) with decision `deny` and its reason in `error`.
   */
  #refuse(res: ServerResponse, call: CallRecord, error: ProxyError, reason: string, extra: Record<string, string> = {}): void {
    call.decision = 'deny';
    call.error = reason;
    this.#reply(res, call, error, extra);
  }

  /** An answer of our own; its record (a refusal's findings above all) is appended before it leaves. */
  #reply(res: ServerResponse, call: CallRecord, error: ProxyError, extra: Record<string, string> = {}): void {
    call.status = error.status;
    this.#appendRecord(call);
    this.#send(res, error, extra);
  }

  /** Appends the call's record once (refusals are not gated: capture-or-deny governs effects). */
  #appendRecord(call: CallRecord): void {
    if (!call.identity || !call.audit || call.audited) return;
    call.audited = true;
    this.#d.audit.append('llm_audit_log', this.#record(call)).catch((err: Error) => {
      this.#d.log.error({ request_id: call.id, err: err.message }, 'audit record lost');
    });
  }

  #finish(call: CallRecord): void {
    const d = this.#d;
    const totalMs = performance.now() - call.started;
    const format = call.format ?? 'unknown';
    d.metrics.requests.inc({ format, status: String(call.status) });
    d.metrics.overhead.observe({ format }, Math.max(0, totalMs - (call.upstreamMs ?? 0)) / 1000);
    if (call.format) d.metrics.responseBytes.observe({ format }, call.responseBytes);
    this.#appendRecord(call);
  }

  #record(call: CallRecord): Record<string, unknown> {
    const d = this.#d;
    const totalMs = performance.now() - call.started;
    const snapshot = d.snapshot();
    return {
      id: call.id,
      event_time: new Date().toISOString(),
      org_id: call.identity!.orgId,
      agent_id: call.identity!.agentId,
      agent_name: call.identity!.agentName,
      enclave_id: d.options.enclaveId || snapshot.enclave.id,
      format: call.format,
      upstream_format: call.upstreamFormat,
      path: call.path,
      model: call.model,
      status: call.status,
      upstream_status: call.upstreamStatus,
      latency_ms: round(totalMs),
      upstream_latency_ms: call.upstreamMs === null ? null : round(call.upstreamMs),
      overhead_ms: round(Math.max(0, totalMs - (call.upstreamMs ?? 0))),
      request_bytes: call.requestBytes,
      response_bytes: call.responseBytes,
      input_tokens: call.usage?.input_tokens ?? null,
      output_tokens: call.usage?.output_tokens ?? null,
      decision: call.decision,
      findings: call.findings,
      inspection_failopen: call.failOpen,
      inspection_failures: call.failures,
      error: call.error,
    };
  }
}

/**
 * A plain answer is held whole, up to this size: far past any model's answer, and a bound on what a
 * small compressed answer may decode to.
 */
const MAX_HELD_ANSWER_BYTES = 4 * MAX_BODY_BYTES;
/** The piece a held answer is written in: each one the agent takes is progress (send()). */
const SEND_PIECE_BYTES = 64 * 1024;

/** A whole body, refused past MAX_HELD_ANSWER_BYTES. */
async function collect(body: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    chunks.push(chunk);
    size += chunk.length;
    if (size > MAX_HELD_ANSWER_BYTES) throw new Error(`upstream answer exceeds ${MAX_HELD_ANSWER_BYTES} bytes`);
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}

/**
 * Writes a chunk, waiting for the agent's socket to drain when its buffer is full: 'sent', 'closed' when
 * the response closed first, 'stalled' when the agent took nothing for `stallMs` (the response is then
 * destroyed, which releases the upstream feeding it).
 */
async function send(res: ServerResponse, chunk: Buffer, stallMs: number): Promise<'sent' | 'closed' | 'stalled'> {
  if (res.destroyed) return 'closed';
  const socket = res.socket;
  if (res.write(chunk)) return 'sent';
  return new Promise((resolve) => {
    const done = (how: 'sent' | 'closed' | 'stalled') => {
      clearTimeout(timer);
      res.off('drain', drained);
      res.off('close', closed);
      resolve(how);
    };
    const drained = () => done('sent');
    // Closed by the listener's own send-stall bound (core/server-limits.ts) is a stall too.
    const closed = () => done(closedForSendStall(socket) ? 'stalled' : 'closed');
    // Progress (a write completing) makes node emit 'drain' only once the whole buffer is gone, so the
    // bound restarts while the buffered bytes shrink: a slow reader that keeps reading is not cut.
    let left = res.writableLength;
    const timer = setTimeout(function check() {
      if (res.writableLength < left) {
        left = res.writableLength;
        timer.refresh();
        return;
      }
      done('stalled');
      res.destroy();
    }, stallMs);
    res.on('drain', drained);
    res.on('close', closed);
  });
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
