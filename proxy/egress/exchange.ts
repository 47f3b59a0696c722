import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { gated } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { DEFAULT_INLINE_THRESHOLD_BYTES, MAX_BODY_BYTES } from '../../pipeline/engine.ts';
import type { Snapshot } from '../../pipeline/policy/snapshot.ts';
import { agentStanding } from '../llm/agent-standing.ts';
import type { AgentIdentity } from '../llm/auth.ts';
import { RequestTooLargeError } from '../llm/errors.ts';
import { readBody } from '../llm/read-body.ts';
import { send } from '../llm/relay-body.ts';
import { BodyBudget, type BudgetShortfall } from '../../core/body-budget.ts';
import { codingsOf, decodeBody, MAX_CODINGS, undecodable } from './body-coding.ts';
import { BodyCapture, CAPTURE_LOOKAHEAD, captures, capturedText, recordedHeaders, redactor } from './capture.ts';
import type { ExchangeHandler, Flow, GatewayDeps, PinnedTarget } from './context.ts';
import { ANSWERS, GatewayRefusal } from './errors.ts';
import { credentialUnavailable, EXCHANGE_ANSWERS, refusedShape, undecodableBody } from './exchange-answers.ts';
import { recordFlow } from './flow-record.ts';
import { inspectBody, noteOutcome } from './exchange-inspection.ts';
import { type Route, routedKind, routeOf } from './exchange-route.ts';
import { canonicalHost } from './host-match.ts';
import { rulesFor } from './inject-cred.ts';
import { agentResponseHeaders, smugglingProblem, upstreamRequestHeaders } from './hop-headers.ts';
import { PinnedPools } from './pinned-pools.ts';
import { inTurn } from './pipelining.ts';

// One HTTP request forwarded (docs/gateway.md, "Interception and capture"): an absolute-form request
// (scheme http) or one inside a terminated tunnel (scheme https). Every request is answered, and its
// `network_flow` record appended once it has ended (after the response's observe-only inspection).
//
//   request ─▶ shape: smuggling shapes, the request target, Host = the tunnel's host (else 421)
//           ─▶ body: captured hosts (--http-capture, not --no-capture-host) are read whole (≤ 32 MB,
//              413), decoded (gzip, deflate, br, zstd; 415 otherwise) and inspected with the agent's
//              content policy: block → 403, unavailable (fail-closed) → 503; nothing has left yet.
//              llmproxy's requests are not inspected here (llmproxy inspects its calls); requests not
//              captured are streamed as they come
//           ─▶ route (exchange-route.ts): llmproxy, the control plane, or the pinned destination;
//              --inject-cred headers (a missing secret → 403, nothing sent)
//           ─▶ the records of the credentials and tokens it carries made durable (capture-or-deny:
//              503 and nothing sent), then sent, response headers within --upstream-timeout (504)
//           ─▶ response: status and headers relayed (hop-by-hop removed), body streamed as it comes,
//              bounded for an agent that stops reading (--idle-timeout), first bytes captured
//           ─▶ the captured response inspected observe-only (findings recorded), the record appended
//
// Outcome: `deny` when the gateway refused the request itself (a 4xx or 503 of its own), `allow` when
// it was let through, whatever became of it (a 502 or 504 from a destination that failed, an agent that
// left): the reason says which.

export function exchangeHandler(deps: GatewayDeps): ExchangeHandler {
  const pools = new PinnedPools({ upstreamCa: deps.upstreamCa, connectTimeoutMs: deps.options.connectTimeout });
  const budget = new BodyBudget(deps.options.maxBufferedBodies, deps.options.maxBufferedBodiesPerAgent, (held) =>
    deps.metrics.bufferedBodies.set(held),
  );
  return (req, res, target, scheme, flow) => {
    // One exchange at a time per connection, in the order the agent sent them (pipelining.ts): a
    // pipelined flood must not hold a 32 MB body per request.
    inTurn(
      req,
      res,
      () => void new Exchange(deps, pools, budget, req, res, target, scheme, flow).run(),
      (why) => {
        flow.attrs.method = req.method ?? '';
        flow.outcome = 'deny';
        flow.reason = why;
        recordFlow(deps, flow);
      },
    );
  };
}

/** Whether the request announces a body (a length other than 0, or chunked). */
function hasBody(req: IncomingMessage): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

/** Which of undici's timers or the connect bound cut a call, for its answer (504). */
function timedOut(err: unknown): string | null {
  for (
    let e = err as { code?: unknown; cause?: unknown } | undefined, d = 0;
    e && d < 4;
    e = e.cause as typeof e, d++
  ) {
    if (e.code === 'UND_ERR_HEADERS_TIMEOUT') return 'no response headers';
    if (e.code === 'UND_ERR_CONNECT_TIMEOUT') return 'no connection';
    if (e.code === 'UND_ERR_BODY_TIMEOUT') return 'no response body';
  }
  return null;
}

function errorText(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown; cause?: { code?: unknown; message?: unknown } };
  const code = typeof e.code === 'string' ? e.code : typeof e.cause?.code === 'string' ? e.cause.code : '';
  const message = typeof e.message === 'string' ? e.message : String(err);
  return code && !message.includes(code) ? `${code}: ${message}` : message;
}

class Exchange {
  readonly #deps: GatewayDeps;
  readonly #pools: PinnedPools;
  readonly #budget: BodyBudget;
  /** Bytes of this request's body taken from the budget (given back when the exchange ends). */
  #held = 0;
  readonly #req: IncomingMessage;
  readonly #res: ServerResponse;
  readonly #target: PinnedTarget;
  readonly #scheme: 'http' | 'https';
  readonly #flow: Flow;
  readonly #abort = new AbortController();
  readonly #snapshot: Snapshot;
  #identity: AgentIdentity | null = null;
  #capturing = false;
  #route: Route | null = null;
  /** The request's headers as they left (for the record), and the response's as relayed. */
  #sentHeaders: string[] | null = null;
  #answerHeaders: string[] | null = null;
  #requestCapture: BodyCapture | null = null;
  #responseCapture: BodyCapture | null = null;
  #requestBytes = 0;
  #path = '';

  constructor(
    deps: GatewayDeps,
    pools: PinnedPools,
    budget: BodyBudget,
    req: IncomingMessage,
    res: ServerResponse,
    target: PinnedTarget,
    scheme: 'http' | 'https',
    flow: Flow,
  ) {
    this.#deps = deps;
    this.#pools = pools;
    this.#budget = budget;
    this.#req = req;
    this.#res = res;
    this.#target = target;
    this.#scheme = scheme;
    this.#flow = flow;
    this.#snapshot = deps.snapshot();
  }

  async run(): Promise<void> {
    const res = this.#res;
    // The agent left before the end: whatever is still running for it (the upstream call) stops.
    res.once('close', () => {
      if (!res.writableFinished) this.#abort.abort();
    });
    this.#req.on('error', (err) =>
      this.#deps.log.debug({ err, flow_id: this.#flow.id }, 'agent request stream failed'),
    );
    try {
      await this.#forward();
    } catch (err) {
      this.#fail(err);
    }
    try {
      await this.#inspectResponse();
      await this.#capture();
    } catch (err) {
      this.#deps.log.error({ err, flow_id: this.#flow.id }, 'exchange capture failed');
    }
    this.#budget.give(this.#holder(), this.#held);
    this.#held = 0;
    recordFlow(this.#deps, this.#flow);
  }

  async #forward(): Promise<void> {
    const deps = this.#deps;
    const o = deps.options;
    const req = this.#req;
    const flow = this.#flow;
    const target = this.#target;
    if (flow.dstIp === '') flow.dstIp = target.address;
    flow.attrs.method = req.method ?? '';
    this.#identity = flow.identity;
    if (this.#identity === null)
      throw new GatewayRefusal(ANSWERS.agentRefused, 'the request carries no agent identity');
    // A terminated tunnel lives on after its CONNECT was admitted: each request inside is an attempt of
    // its own, so the agent's standing is read again from the snapshot current now (a suspension or a
    // containment since the CONNECT stops it here, before any credential is added to its requests).
    const standing = agentStanding(this.#snapshot, this.#identity);
    if (standing.refused) throw new GatewayRefusal(ANSWERS.agentRefused, standing.reason);
    const identity = this.#identity;

    const problem = smugglingProblem(req);
    if (problem !== null) throw new GatewayRefusal(refusedShape(problem), `request refused: ${problem}`);
    this.#path = this.#requestPath();
    this.#checkHost();

    const kind = routedKind(deps, target.host, target.port);
    // RFC 9110 §9.3.8: a TRACE answer is the request as the destination received it, headers included;
    // a credential the gateway adds (an --inject-cred header, an agent-operator token, the identity
    // header) would come back to the agent in it. Such a request is not sent.
    if (
      /^(?:trace|track)$/i.test(req.method ?? '') &&
      (kind !== 'destination' || rulesFor(deps.injectRules, target.host, target.port).length > 0)
    )
      throw new GatewayRefusal(
        credentialUnavailable(
          `${req.method} is not sent to ${this.#flow.dst}: its answer would echo the credential the gateway adds`,
        ),
        `${req.method} refused: it would echo the credential the gateway adds`,
      );
    this.#capturing = captures(o, target.host);
    // llmproxy inspects (and records) the LLM calls it serves: inspecting them here too would decide twice.
    const inspect = this.#capturing && kind !== 'llmproxy';
    if (this.#capturing) this.#requestCapture = new BodyCapture(o.httpCaptureMaxBody);

    let body: Buffer | Readable | null = null;
    let streamedLength: string | undefined;
    if (inspect) {
      const whole = await this.#readWhole();
      await this.#inspectRequest(whole, identity);
      body = whole.length > 0 ? whole : null;
    } else if (hasBody(req)) {
      body = Readable.from(this.#stream(), { objectMode: false });
      streamedLength = req.headers['content-length'];
    } else req.resume();

    const route = await routeOf(
      deps,
      this.#pools,
      target,
      this.#scheme,
      identity,
      req.method ?? 'GET',
      this.#path,
      flow,
    );
    this.#route = route;
    flow.attrs.route = route.kind;
    const headers = upstreamRequestHeaders(req.rawHeaders, new Set(route.headers.keys()));
    if (streamedLength !== undefined) headers.push('content-length', streamedLength);
    for (const [name, value] of route.headers) headers.push(name, value);
    this.#sentHeaders = headers;
    if (route.credentialHeaders.length > 0) flow.attrs.injected_headers = route.credentialHeaders.join(',');

    const call = (): Promise<Dispatcher.ResponseData> =>
      route.dispatcher.request({
        origin: route.origin,
        path: this.#path,
        method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
        headers,
        body,
        signal: this.#abort.signal,
        headersTimeout: o.upstreamTimeout,
        bodyTimeout: o.upstreamTimeout,
      });
    const answer = await this.#send(route, call);
    if (Buffer.isBuffer(body)) flow.bytesUp += body.length;
    await this.#relay(answer);
  }

  /** The path (and query) to send: origin-form as it is, absolute-form naming the tunnel's host reduced to it. */
  #requestPath(): string {
    const raw = this.#req.url ?? '';
    if (raw.startsWith('/')) return raw;
    if (!/^https?:\/\//i.test(raw))
      throw new GatewayRefusal(
        refusedShape('the request target must be a path or an absolute URL'),
        'bad request target',
      );
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      throw new GatewayRefusal(refusedShape('the request target does not parse'), 'bad request target');
    }
    if (url.username !== '' || url.password !== '' || /^[a-z]+:\/\/[^/?#]*@/i.test(raw))
      throw new GatewayRefusal(
        refusedShape('a URL with credentials (user:password@) is refused'),
        'credentials in the request target',
      );
    const port = url.port === '' ? (url.protocol === 'https:' ? 443 : 80) : Number(url.port);
    if (
      url.protocol !== `${this.#scheme}:` ||
      canonicalHost(url.hostname) !== this.#target.host ||
      port !== this.#target.port
    )
      throw new GatewayRefusal(
        EXCHANGE_ANSWERS.misdirected,
        `request target ${url.host.slice(0, 255)} is not ${this.#flow.dst}`,
      );
    return `${url.pathname}${url.search}`;
  }

  /** The Host header names the destination (its port too, when it gives one); all decisions use the destination. */
  #checkHost(): void {
    const host = this.#req.headers.host;
    if (host === undefined) return; // HTTP/1.0: node requires Host of HTTP/1.1 requests
    // A name of host characters only: `Host: denied@allowed` is refused, never read as `allowed`.
    const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$/.exec(host);
    if (m === null) throw new GatewayRefusal(refusedShape('the Host header does not parse'), 'bad Host header');
    if (canonicalHost(m[1]) !== this.#target.host || (m[2] !== undefined && Number(m[2]) !== this.#target.port))
      throw new GatewayRefusal(EXCHANGE_ANSWERS.misdirected, `Host ${host.slice(0, 255)} is not ${this.#flow.dst}`);
  }

  /** Whose share of the body budget this exchange's body is taken from: its agent's (known at admission). */
  #holder(): string {
    return this.#identity?.agentId ?? '';
  }

  /** The refusal of a body that does not fit in what the budget, or its agent's share, has free. */
  #bodiesBusy(short: BudgetShortfall): GatewayRefusal {
    const o = this.#deps.options;
    return new GatewayRefusal(
      EXCHANGE_ANSWERS.bodiesBusy,
      short === 'budget'
        ? `request bodies held for inspection would exceed ${o.maxBufferedBodies} bytes (--max-buffered-bodies)`
        : `request bodies held for inspection by this agent would exceed ${this.#budget.perAgent} bytes (--max-buffered-bodies-per-agent)`,
    );
  }

  async #readWhole(): Promise<Buffer> {
    // The bodies held at once over every connection, and per agent, are bounded (core/body-budget.ts):
    // bytes are taken as they arrive; an announced length is only checked against what is free now.
    const agent = this.#holder();
    const announced = Number(this.#req.headers['content-length']);
    if (Number.isFinite(announced) && announced >= 0 && announced <= MAX_BODY_BYTES) {
      const short = this.#budget.shortfall(agent, announced);
      if (short !== null) throw this.#bodiesBusy(short);
    }
    let body: Buffer;
    try {
      body = await readBody(this.#req, MAX_BODY_BYTES, DEFAULT_INLINE_THRESHOLD_BYTES, 0, (bytes) => {
        const short = this.#budget.take(agent, bytes);
        if (short !== null) throw this.#bodiesBusy(short);
        this.#held += bytes;
      });
    } catch (err) {
      if (err instanceof RequestTooLargeError)
        throw new GatewayRefusal(ANSWERS.tooLarge, `request body exceeds ${MAX_BODY_BYTES} bytes`);
      throw err;
    }
    this.#requestBytes = body.length;
    this.#requestCapture?.push(body);
    return body;
  }

  /** The request body as the agent sends it, captured and counted on its way. */
  async *#stream(): AsyncIterable<Buffer> {
    for await (const chunk of this.#req as AsyncIterable<Buffer>) {
      this.#requestBytes += chunk.length;
      this.#flow.bytesUp += chunk.length;
      this.#requestCapture?.push(chunk);
      yield chunk;
    }
  }

  async #inspectRequest(raw: Buffer, identity: AgentIdentity): Promise<void> {
    const deps = this.#deps;
    const codings = codingsOf(this.#req.headers['content-encoding']);
    let body = raw;
    if (codings.length > 0) {
      if (codings.length > MAX_CODINGS)
        throw new GatewayRefusal(
          undecodableBody(
            `${codings.length} content codings: the body cannot be inspected (at most ${MAX_CODINGS} are undone)`,
          ),
          `${codings.length} content codings cannot be inspected`,
        );
      const unknown = undecodable(codings);
      if (unknown !== null)
        throw new GatewayRefusal(
          undecodableBody(
            `content-encoding ${unknown}: the body cannot be inspected (gzip, deflate, br, zstd or none)`,
          ),
          `content-encoding ${unknown} cannot be inspected`,
        );
      const decoded = await decodeBody(raw, codings, MAX_BODY_BYTES);
      if (decoded.overflow)
        throw new GatewayRefusal(ANSWERS.tooLarge, `decoded request body exceeds ${MAX_BODY_BYTES} bytes`);
      if (decoded.broken)
        throw new GatewayRefusal(
          undecodableBody(`content-encoding ${codings.join(', ')}: the body does not decode`),
          'request body does not decode',
        );
      body = decoded.body;
    }
    let outcome;
    try {
      outcome = await inspectBody(deps, this.#snapshot, identity, body, 'request');
    } catch (err) {
      deps.log.error({ err, flow_id: this.#flow.id }, 'request inspection failed');
      if (deps.options.inspectFailClosed)
        throw new GatewayRefusal(ANSWERS.inspectionUnavailable, 'content inspection unavailable');
      this.#flow.attrs.inspection_failopen = 'true';
      return;
    }
    noteOutcome(deps, this.#flow, outcome, 'request');
    if (outcome.decision === 'block') {
      const inspectors = [
        ...new Set(outcome.findings.filter((f) => f.severity === 'block').map((f) => f.inspector_type)),
      ];
      throw new GatewayRefusal(ANSWERS.contentPolicy, `content policy: ${inspectors.join(', ')}`);
    }
    if (outcome.decision === 'unavailable')
      throw new GatewayRefusal(ANSWERS.inspectionUnavailable, 'content inspection unavailable');
  }

  /** The call, once every record of what it carries is durable (capture-or-deny); refusals and failures as answers. */
  async #send(route: Route, call: () => Promise<Dispatcher.ResponseData>): Promise<Dispatcher.ResponseData> {
    const deps = this.#deps;
    const options = { ...deps.capture, log: deps.log };
    const gatedCall = route.records.reduceRight<() => Promise<Dispatcher.ResponseData>>(
      (next, record) => () => gated(deps.audit, 'audit_events', record, next, options),
      call,
    );
    try {
      return await gatedCall();
    } catch (err) {
      if (err instanceof AuditUnavailableError)
        throw new GatewayRefusal(ANSWERS.auditUnavailable, `audit unavailable: ${err.message}`);
      if (this.#abort.signal.aborted) throw err;
      const what =
        route.kind === 'llmproxy' ? 'llmproxy' : route.kind === 'control-plane' ? 'the control plane' : this.#flow.dst;
      const timer = timedOut(err);
      if (timer !== null)
        throw new GatewayRefusal(
          ANSWERS.upstreamTimeout,
          `${what}: ${timer} within ${deps.options[timer === 'no connection' ? 'connectTimeout' : 'upstreamTimeout']} ms`,
        );
      throw new GatewayRefusal(ANSWERS.upstreamFailed, `${what} failed: ${errorText(err)}`);
    }
  }

  async #relay(answer: Dispatcher.ResponseData): Promise<void> {
    const res = this.#res;
    const flow = this.#flow;
    const o = this.#deps.options;
    flow.attrs.status = String(answer.statusCode);
    this.#answerHeaders = agentResponseHeaders(answer.headers);
    try {
      res.writeHead(answer.statusCode, this.#answerHeaders);
    } catch (err) {
      answer.body.destroy();
      throw new GatewayRefusal(ANSWERS.upstreamFailed, `the destination's answer cannot be relayed: ${errorText(err)}`);
    }
    if (this.#capturing) this.#responseCapture = new BodyCapture(o.httpCaptureMaxBody);
    try {
      for await (const chunk of answer.body as AsyncIterable<Buffer>) {
        flow.bytesDown += chunk.length;
        this.#responseCapture?.push(chunk);
        const sent = await send(res, chunk, o.idleTimeout);
        if (sent !== 'sent') {
          flow.reason =
            sent === 'stalled'
              ? `the agent stopped reading: none of the answer was taken for ${o.idleTimeout} ms (--idle-timeout)`
              : 'the agent closed the connection before the answer was delivered';
          res.destroy();
          return;
        }
      }
    } catch (err) {
      flow.reason = this.#abort.signal.aborted
        ? 'the agent closed the connection before the answer was delivered'
        : `the destination's answer was cut: ${errorText(err)}`;
      res.destroy();
      return;
    }
    res.end();
  }

  /** A refusal or failure as the agent's answer (when it can still be given) and the record's reason. */
  #fail(err: unknown): void {
    const flow = this.#flow;
    const res = this.#res;
    if (!(err instanceof GatewayRefusal)) {
      if (this.#abort.signal.aborted || res.destroyed) {
        flow.reason ||= 'the agent closed the connection before the answer was delivered';
        return;
      }
      this.#deps.log.error({ err, flow_id: flow.id }, 'exchange failed');
      err = new GatewayRefusal(ANSWERS.upstreamFailed, `gateway error: ${errorText(err)}`);
    }
    const refusal = err as GatewayRefusal;
    const { answer } = refusal;
    flow.reason = refusal.reason;
    flow.outcome = answer.status === 502 || answer.status === 504 ? 'allow' : 'deny';
    flow.attrs.status = String(answer.status);
    if (res.headersSent || res.destroyed) {
      res.destroy();
      return;
    }
    const headers: Record<string, string> = {
      'content-type': answer.contentType,
      'content-length': String(answer.body.length),
      ...(refusal.headers ?? {}),
    };
    // A body the agent is still sending is not read on: the connection ends with this answer.
    if (!this.#req.complete) headers.connection = 'close';
    res.writeHead(answer.status, headers);
    res.end(answer.body);
  }

  /** The captured response through the pipeline, observe-only: findings are recorded, nothing is blocked. */
  async #inspectResponse(): Promise<void> {
    const capture = this.#responseCapture;
    const identity = this.#identity;
    if (capture === null || capture.total === 0 || identity === null || this.#route?.kind === 'llmproxy') return;
    const body = await this.#decoded(capture, 'content-encoding', this.#answerHeaders);
    if (body === null || body.length === 0) return;
    try {
      const outcome = await inspectBody(this.#deps, this.#snapshot, identity, body, 'response');
      noteOutcome(this.#deps, this.#flow, outcome, 'response');
    } catch (err) {
      this.#deps.log.error({ err, flow_id: this.#flow.id }, 'response inspection failed');
      this.#flow.attrs.inspection_failopen = 'true';
    }
  }

  /** A capture's bytes with the content coding of its headers undone (null: a coding the gateway cannot undo). */
  async #decoded(capture: BodyCapture, header: string, flat: readonly string[] | null): Promise<Buffer | null> {
    const values: string[] = [];
    for (let i = 0; flat !== null && i + 1 < flat.length; i += 2)
      if (flat[i].toLowerCase() === header) values.push(flat[i + 1]);
    const codings = codingsOf(values);
    if (codings.length === 0) return capture.bytes;
    if (codings.length > MAX_CODINGS || undecodable(codings) !== null) return null;
    return (await decodeBody(capture.bytes, codings, this.#deps.options.httpCaptureMaxBody + CAPTURE_LOOKAHEAD)).body;
  }

  /** What the record keeps of the request: url, sizes, and with capture on, headers and bodies (redacted). */
  async #capture(): Promise<void> {
    const flow = this.#flow;
    const deps = this.#deps;
    const limit = deps.options.httpCaptureMaxBody;
    const identity = this.#identity;
    const values = [
      ...(identity ? deps.secrets.agentSecrets(identity.agentId) : []),
      ...(this.#route?.secretValues ?? []),
    ];
    const redact = redactor(values);
    const t = this.#target;
    const authority = `${t.host.includes(':') ? `[${t.host}]` : t.host}:${t.port}`;
    flow.attrs.url = redact(`${this.#scheme}://${authority}${this.#path || (this.#req.url ?? '')}`);
    flow.attrs.request_body_bytes = String(this.#requestBytes);
    flow.attrs.response_body_bytes = String(flow.bytesDown);
    if (!this.#capturing) return;
    const drop = new Set(this.#route?.headers.keys() ?? []);
    flow.attrs.request_headers = recordedHeaders(this.#sentHeaders ?? this.#req.rawHeaders, drop, redact);
    const request = this.#requestCapture;
    if (request !== null) {
      const bytes = await this.#decoded(request, 'content-encoding', this.#req.rawHeaders);
      flow.attrs.request_body = bytes === null ? '' : capturedText(bytes, limit, redact);
      flow.attrs.request_truncated = String(request.truncated || (bytes !== null && bytes.length > limit));
    }
    if (this.#answerHeaders !== null) flow.attrs.response_headers = recordedHeaders(this.#answerHeaders, drop, redact);
    const response = this.#responseCapture;
    if (response !== null) {
      const bytes = await this.#decoded(response, 'content-encoding', this.#answerHeaders);
      flow.attrs.response_body = bytes === null ? '' : capturedText(bytes, limit, redact);
      flow.attrs.response_truncated = String(response.truncated || (bytes !== null && bytes.length > limit));
    }
  }
}
