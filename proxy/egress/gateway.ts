import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import { isIP } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { agentStanding } from '../llm/agent-standing.ts';
import { certificateIdentity, type AgentIdentity } from '../llm/auth.ts';
import { AuthError } from '../llm/errors.ts';
import { governanceOf } from '../../pipeline/policy/snapshot-governance.ts';
import { Flow, type FlowProto, type GatewayDeps, type PinnedTarget, type Target } from './context.ts';
import { destinationGates, refuseByName } from './destination.ts';
import {
  ANSWERS,
  badProxyRequest,
  destinationRefused,
  GatewayRefusal,
  PROXY_AUTHENTICATE,
  type GatewayAnswer,
} from './errors.ts';
import { recordFlow } from './flow-record.ts';
import { canonicalHost } from './host-match.ts';
import { rulesFor } from './inject-cred.ts';
import { inTurn } from './pipelining.ts';
import { admitDestination, admitRouted } from './resolve.ts';
import { answerSocket, openTunnel } from './tunnel.ts';

// The gateway's two doors (docs/gateway.md): `CONNECT host:port` (node's 'connect' event) and an
// absolute-form `http://…` request ('request'). Anything else is a 400, but `GET /healthz`.
//
//   attempt ─▶ draining? 503 ─▶ identity: Proxy-Authorization Bearer JWT, else the mTLS certificate (407)
//           ─▶ standing in the snapshot: org, suspended / isolated / contained (403)
//           ─▶ the target, parsed strictly (400)
//           ─▶ destination: routed hosts (--llm-host, --cp-api-host) by name only; the rest resolved
//              once, every address checked, pinned (403 destination_denied, 502/504 resolution)
//           ─▶ CONNECT: intercepted (intercept.ts) or a blind tunnel (tunnel.ts)
//              absolute-form: one exchange (exchange.ts)
//
// A refusal is one GatewayRefusal, turned into its answer and its network_flow record in one place
// (#refuse). Proxy-Authorization is the gateway's alone: it never goes further. The agent's own
// Authorization header belongs to the destination and is not read here.

const HEALTH_PATH = '/healthz';
/** The longest target text kept in a refused flow's record. */
const MAX_RECORDED_TARGET = 256;
/** A CONNECT authority: a host name or IPv4 address, or an IPv6 address in brackets, then a port. */
const AUTHORITY = /^(?:\[([0-9a-f:.]+)\]|([a-z0-9_.-]+)):([0-9]{1,5})$/i;
const BEARER = /^bearer[ \t]+([^\s]+)[ \t]*$/i;
const CONTROL = /[\u0000-\u0020\u007f]/;

/** The client's address as rules and records compare it: an IPv4-mapped IPv6 address is its IPv4 address. */
function clientAddress(socket: Duplex & { remoteAddress?: string; remotePort?: number }) {
  const a = socket.remoteAddress ?? '';
  return { address: a.startsWith('::ffff:') ? a.slice(7) : a, port: socket.remotePort ?? 0 };
}

function printable(text: string): string {
  return text.slice(0, MAX_RECORDED_TARGET).replace(/[\u0000-\u001f\u007f]/g, '?');
}

/**
 * A host as the rules compare it, whatever its spelling: lower case, no brackets, an IPv4 address in
 * dotted form (`0x7f.1` is 127.0.0.1, as a URL's host parser reads it), an IPv6 address compressed,
 * and an IPv4-mapped IPv6 address as its IPv4 address (so a rule naming 127.0.0.1 is not dodged by
 * `[::ffff:127.0.0.1]`).
 */
function parseHost(host: string): string | null {
  let parsed: string;
  try {
    parsed = new URL(`http://${host}/`).hostname;
  } catch {
    return null;
  }
  const h = canonicalHost(parsed);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  if (mapped) {
    const [hi, lo] = [Number.parseInt(mapped[1], 16), Number.parseInt(mapped[2], 16)];
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  return h === '' ? null : h;
}

function parsePort(text: string): number | null {
  if (!/^[1-9][0-9]{0,4}$/.test(text)) return null;
  const port = Number(text);
  return port <= 65535 ? port : null;
}

/** `CONNECT host:port`'s target; throws a 400 GatewayRefusal naming what is wrong. */
export function connectTarget(authority: string): Target {
  const bad = (why: string): never => {
    throw new GatewayRefusal(badProxyRequest(`CONNECT target "${printable(authority)}": ${why}`), why);
  };
  if (CONTROL.test(authority)) bad('control characters or spaces are not allowed');
  const m = AUTHORITY.exec(authority);
  if (!m) bad('expected host:port (an IPv6 address in brackets: [2001:db8::1]:443)');
  const port = parsePort(m![3]);
  if (port === null) bad('the port must be 1..65535');
  if (m![1] !== undefined) {
    if (isIP(m![1]) !== 6) bad(`[${m![1]}] is not an IPv6 address`);
    return { host: parseHost(`[${m![1]}]`)!, port: port! };
  }
  const host = parseHost(m![2]);
  if (host === null) bad(`"${m![2]}" is not a host name`);
  return { host: host!, port: port! };
}

/** An absolute-form request's target (`http://host[:port]/…`); throws a 400 GatewayRefusal. */
export function absoluteTarget(rawUrl: string): Target {
  const bad = (why: string): never => {
    throw new GatewayRefusal(badProxyRequest(why), why);
  };
  if (CONTROL.test(rawUrl)) bad('control characters or spaces are not allowed in the request target');
  let url: URL;
  try {
    url = new URL(rawUrl);
  } catch {
    return bad('the request target is not an absolute URL');
  }
  if (url.protocol === 'https:')
    bad('https:// is not forwarded in absolute form: open a CONNECT tunnel (HTTPS_PROXY) for https');
  if (url.protocol !== 'http:')
    bad(`${url.protocol}// is not forwarded: only http:// in absolute form, and CONNECT tunnels`);
  if (url.username !== '' || url.password !== '' || /^[a-z]+:\/\/[^/?#]*@/i.test(rawUrl))
    bad('a URL with credentials (user:password@) is refused');
  const host = parseHost(url.host.replace(/:\d*$/, '')) ?? '';
  if (host === '') bad('the URL names no host');
  const port = url.port === '' ? 80 : parsePort(url.port);
  if (port === null) bad('the port must be 1..65535');
  return { host, port: port! };
}

/**
 * The Host header must name the target: one Host header, its host the target's, its port (when given;
 * `defaultPort` when not, for absolute-form) the target's. Null when it agrees.
 */
export function hostHeaderProblem(rawHeaders: string[], target: Target, defaultPort: number | null): string | null {
  const values: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2)
    if (rawHeaders[i].toLowerCase() === 'host') values.push(rawHeaders[i + 1]);
  if (values.length === 0) return null;
  if (values.length > 1) return 'more than one Host header';
  const value = values[0].trim();
  const m = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::([0-9]*))?$/i.exec(value);
  const host = m ? parseHost(m[1]) : null;
  if (!m || host === null) return `the Host header "${printable(value)}" is not host[:port]`;
  const port = m[2] ? parsePort(m[2]) : defaultPort;
  if (host !== target.host || (port !== null && port !== target.port))
    return `the Host header "${printable(value)}" does not name the target ${target.host}:${target.port}`;
  return null;
}

/** Identity of an attempt, or why there is none (the error's identity is set when the token's signature verified). */
type Identified = { identity: AgentIdentity; error: null } | { identity: AgentIdentity | null; error: AuthError };

export class Gateway {
  readonly #d: GatewayDeps;
  #draining = false;
  /** CONNECT sockets handed to a tunnel or the interceptor, until they close. */
  readonly #tunnels = new Set<Duplex>();
  /** Absolute-form requests handed to the exchange, until their response closes. */
  #exchanges = 0;
  #idle: (() => void) | null = null;

  constructor(deps: GatewayDeps) {
    this.#d = deps;
  }

  /**
   * Refuses new attempts (503) and resolves once the tunnels and exchanges in flight have finished, or
   * after `graceMs`, when the tunnels still open are closed.
   */
  async drain(graceMs: number): Promise<void> {
    this.#draining = true;
    if (this.#tunnels.size > 0 || this.#exchanges > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => (this.#idle = resolve)),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, graceMs);
        }),
      ]);
      clearTimeout(timer);
    }
    for (const socket of this.#tunnels) socket.destroy();
  }

  #settled(): void {
    if (this.#tunnels.size === 0 && this.#exchanges === 0) this.#idle?.();
  }

  /** node's 'connect' event: `CONNECT host:port`. The socket is ours from here; its errors too. */
  readonly connect = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    socket.on('error', (err: Error) => this.#d.log.debug({ err }, 'agent connection error'));
    if (this.#draining) {
      answerSocket(socket, ANSWERS.shuttingDown, null);
      return;
    }
    this.#connect(req, socket, head).catch((err: Error) => {
      this.#d.log.error({ err }, 'CONNECT failed');
      socket.destroy();
    });
  };

  /** node's 'request' event: an absolute-form `http://` request, or `/healthz`. */
  readonly request = (req: IncomingMessage, res: ServerResponse): void => {
    const url = req.url ?? '';
    if (url.startsWith('/')) {
      const path = url.split('?')[0];
      if (path === HEALTH_PATH && (req.method === 'GET' || req.method === 'HEAD')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        const status = this.#draining ? 'draining' : 'ok';
        res.end(JSON.stringify({ component: 'gateway', status, version: this.#d.version }));
        return;
      }
      writeAnswer(
        req,
        res,
        badProxyRequest(
          'this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT host:port, with the gateway as your proxy',
        ),
        null,
      );
      return;
    }
    if (this.#draining) {
      writeAnswer(req, res, ANSWERS.shuttingDown, null);
      return;
    }
    // Admitted (token, destination lookup) only when its turn comes: requests pipelined behind one in
    // flight wait unread, a flood of them closes the connection (pipelining.ts).
    inTurn(
      req,
      res,
      () =>
        this.#request(req, res).catch((err: Error) => {
          this.#d.log.error({ err }, 'proxy request failed');
          if (!res.headersSent) writeAnswer(req, res, ANSWERS.upstreamFailed, null);
          else res.destroy();
        }),
      (why) => this.#d.log.info({ src: req.socket.remoteAddress }, `pipelined request dropped: ${why}`),
    );
  };

  async #connect(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const d = this.#d;
    const { flow, target, refusal } = await this.#admit(req, socket as TLSSocket, 'tcp', () =>
      connectTarget(req.url ?? ''),
    );
    // A shutdown that began while the attempt was being admitted refuses it: nothing opens past the drain.
    const refused =
      refusal ?? (this.#draining ? new GatewayRefusal(ANSWERS.shuttingDown, 'the gateway is shutting down') : null);
    if (refused) {
      this.#refuse(flow, refused);
      answerSocket(socket, refused.answer, refused.headers);
      return;
    }
    const pinned = target!;
    this.#tunnels.add(socket);
    socket.once('close', () => {
      this.#tunnels.delete(socket);
      this.#settled();
    });
    if (d.interceptor?.wants(pinned)) {
      flow.dstIp = pinned.address;
      flow.attrs.status = '200';
      d.metrics.tunnelsOpen.inc({ kind: 'intercepted' });
      socket.once('close', () => d.metrics.tunnelsOpen.dec({ kind: 'intercepted' }));
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      // The tunnel is recorded once the interceptor is done with it (its socket closed, every request
      // inside answered): its bytes and attrs are final then.
      const failed = (err: unknown) => {
        d.log.error({ err, flow_id: flow.id }, 'interception failed');
        flow.reason = `interception failed: ${(err as Error).message}`;
        socket.destroy();
      };
      try {
        d.interceptor.serve(socket, head, pinned, flow).then(
          () => recordFlow(d, flow),
          (err: unknown) => {
            failed(err);
            recordFlow(d, flow);
          },
        );
      } catch (err) {
        failed(err);
        recordFlow(d, flow);
      }
      return;
    }
    openTunnel(d, socket as TLSSocket, head, pinned, flow);
  }

  async #request(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const d = this.#d;
    const { flow, target, refusal } = await this.#admit(req, req.socket as TLSSocket, 'http', () => {
      const t = absoluteTarget(req.url ?? '');
      const hostProblem = hostHeaderProblem(req.rawHeaders, t, 80);
      if (hostProblem) throw new GatewayRefusal(badProxyRequest(hostProblem), hostProblem);
      return t;
    });
    const refused =
      refusal ?? (this.#draining ? new GatewayRefusal(ANSWERS.shuttingDown, 'the gateway is shutting down') : null);
    if (refused) {
      flow.attrs.method = req.method ?? '';
      flow.attrs.url = printable(req.url ?? '');
      this.#refuse(flow, refused);
      writeAnswer(req, res, refused.answer, refused.headers);
      return;
    }
    // The gateway's credential stops here; the agent's own headers go on.
    delete req.headers['proxy-authorization'];
    for (let i = req.rawHeaders.length - 2; i >= 0; i -= 2)
      if (req.rawHeaders[i].toLowerCase() === 'proxy-authorization') req.rawHeaders.splice(i, 2);
    this.#exchanges++;
    res.once('close', () => {
      this.#exchanges--;
      this.#settled();
    });
    d.exchange(req, res, target!, 'http', flow);
  }

  /**
   * Identity, standing, target and destination of one attempt. Returns the flow (for the record) and
   * either the pinned target or the refusal to answer.
   */
  async #admit(
    req: IncomingMessage,
    socket: TLSSocket,
    proto: FlowProto,
    parse: () => Target,
  ): Promise<{ flow: Flow; target: PinnedTarget | null; refusal: GatewayRefusal | null }> {
    const d = this.#d;
    const who = await this.#identify(req, socket);
    let target: Target | null = null;
    let badTarget: GatewayRefusal | null = null;
    try {
      target = parse();
    } catch (err) {
      if (!(err instanceof GatewayRefusal)) throw err;
      badTarget = err;
    }
    const flow = new Flow(proto, clientAddress(socket), target ?? { host: '', port: 0 });
    if (target === null) flow.dst = printable(req.url ?? '');
    flow.identity = who.identity;
    const refused = (refusal: GatewayRefusal) => ({ flow, target: null, refusal });
    if (who.error) {
      d.metrics.authFailures.inc({ reason: who.error.reason });
      d.log.warn(
        {
          err: who.error,
          reason: who.error.reason,
          flow_id: flow.id,
          src: flow.src,
          agent_id: who.identity?.agentId,
          org_id: who.identity?.orgId,
        },
        'agent authentication failed',
      );
      return refused(
        new GatewayRefusal(ANSWERS.proxyAuthRequired, `agent authentication failed: ${who.error.message}`, {
          'proxy-authenticate': PROXY_AUTHENTICATE,
        }),
      );
    }
    // The snapshot current once the caller is known: a suspension that landed meanwhile applies.
    const snapshot = d.snapshot();
    const standing = agentStanding(snapshot, who.identity);
    flow.identity = standing.identity;
    if (standing.refused) {
      d.log.warn(
        {
          flow_id: flow.id,
          agent_id: who.identity.agentId,
          token_org: who.identity.orgId,
          status: standing.status,
          contained: standing.contained,
        },
        standing.why === 'org' ? 'agent org does not match the snapshot' : 'agent refused by its state',
      );
      return refused(new GatewayRefusal(ANSWERS.agentRefused, standing.reason));
    }
    if (badTarget || target === null) return refused(badTarget!);
    if (proto === 'tcp') {
      const hostProblem = hostHeaderProblem(req.rawHeaders, target, null);
      if (hostProblem) return refused(new GatewayRefusal(badProxyRequest(hostProblem), hostProblem));
    }
    const identity = standing.identity;
    const gates = destinationGates(
      governanceOf(snapshot, identity.orgId, identity.groupId, identity.agentId),
      d.cliRules,
    );
    const toLlmproxy = d.llmproxy?.matches(target.host) ?? false;
    const toControlPlane = d.operatorTokens?.matches(target.host, target.port) ?? false;
    // A tunnel to a host the gateway must govern inside (a route, a credential) is refused unless its
    // TLS is terminated: a blind tunnel would carry the agent past the route or without the credential.
    if (proto === 'tcp') {
      const must = toLlmproxy
        ? 'its requests are routed to llmproxy'
        : toControlPlane
          ? 'its requests carry an agent-operator token'
          : rulesFor(d.injectRules, target.host, target.port).length > 0
            ? 'a --inject-cred rule applies to it'
            : null;
      if (must !== null && !d.interceptor?.wants(target)) {
        const reason =
          refuseByName(gates, target) ??
          `a tunnel to ${flow.dst} must be intercepted (${must}) and the gateway has no interception CA (--ca-cert)`;
        return refused(new GatewayRefusal(destinationRefused(reason), reason));
      }
    }
    try {
      const pinned =
        toLlmproxy || toControlPlane
          ? admitRouted(gates, target)
          : await admitDestination(gates, target, d.lookup, d.options.connectTimeout);
      flow.dstIp = pinned.address;
      return { flow, target: pinned, refusal: null };
    } catch (err) {
      if (!(err instanceof GatewayRefusal)) throw err;
      return refused(err);
    }
  }

  /** Proxy-Authorization: Bearer <platform JWT> when present (never rescued by a certificate), else the mTLS certificate. */
  async #identify(req: IncomingMessage, socket: TLSSocket): Promise<Identified> {
    const raw = req.headers['proxy-authorization'];
    try {
      if (raw !== undefined) {
        const m = BEARER.exec(raw);
        if (!m) throw new AuthError('malformed', 'Proxy-Authorization must be "Bearer <platform JWT>"');
        return { identity: await this.#d.auth.verifyToken(m[1], null), error: null };
      }
      const fromCert = certificateIdentity(socket);
      if (fromCert) return { identity: fromCert, error: null };
      throw new AuthError(
        'agent',
        'missing agent credential (Proxy-Authorization: Bearer, or an identity certificate)',
      );
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      return { identity: err.identity, error: err };
    }
  }

  /** A refused attempt: its record (when the caller is known) and its metric; the door writes the answer. */
  #refuse(flow: Flow, refusal: GatewayRefusal): void {
    flow.outcome = 'deny';
    flow.reason = refusal.reason;
    flow.attrs.status = String(refusal.answer.status);
    this.#d.metrics.refusals.inc({ status: String(refusal.answer.status) });
    if (refusal.answer.status !== 407)
      this.#d.log.info(
        { flow_id: flow.id, agent_id: flow.identity?.agentId, dst: flow.dst, status: refusal.answer.status },
        `attempt refused: ${refusal.reason}`,
      );
    recordFlow(this.#d, flow);
  }
}

/** One of the gateway's own answers to an absolute-form request (the connection closed after it when a body would follow). */
function writeAnswer(
  req: IncomingMessage,
  res: ServerResponse,
  answer: GatewayAnswer,
  headers: Record<string, string> | null,
): void {
  req.resume();
  // A body the gateway will not forward is not read to its end on a kept-alive connection.
  const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
  const close = answer.status === 400 || answer.status === 503 || hasBody;
  res.writeHead(answer.status, STATUS_CODES[answer.status], {
    'content-type': answer.contentType,
    'content-length': answer.body.length,
    ...(close ? { connection: 'close' } : {}),
    ...headers,
  });
  res.end(answer.body);
}
