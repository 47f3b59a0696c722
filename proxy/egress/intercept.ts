import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { TLSSocket } from 'node:tls';
import { serverOptions } from '../../core/server-limits.ts';
import { captures } from './capture.ts';
import { Flow, type GatewayDeps, type Interceptor, type PinnedTarget, type Target } from './context.ts';
import { GatewayOptionsError, jsonAnswer } from './errors.ts';
import { routedKind } from './exchange-route.ts';
import { canonicalHost } from './host-match.ts';
import { rulesFor } from './inject-cred.ts';
import { LeafIssuer } from './leaf-issuer.ts';

// A tunnel whose TLS the gateway terminates (docs/gateway.md, "Interception and capture"):
//
//   client socket (after `200 Connection Established`; `head`: bytes that came with the CONNECT)
//     ─▶ server-side TLS: the leaf of the CONNECT host (leaf-issuer.ts), ALPN http/1.1 only; an SNI
//        naming another host fails the handshake; no SNI gets the CONNECT host's leaf; a handshake not
//        done within --tls-handshake-timeout is cut
//     ─▶ HTTP/1.1 served by one node:http Server for every tunnel, under the listener's bounds
//        (--headers-timeout, --request-timeout, --keep-alive-timeout, --idle-timeout)
//     ─▶ each request: a Flow of its own (proto https, the tunnel's identity) handed to the exchange
//
// The tunnel's own flow (proto tcp) is recorded by whoever opened it, once serve() has resolved: its
// attrs then say `intercepted: true`, how many requests it carried, and why its TLS failed if it did;
// its bytes are the sum of its requests' (bodies, to and from the destination).

export async function openInterceptor(deps: GatewayDeps): Promise<Interceptor> {
  const o = deps.options;
  if (!o.caCert || !o.caKey)
    throw new GatewayOptionsError('interception needs --ca-cert and --ca-key (the CA its leaves are minted from)');
  return new TlsInterceptor(deps, await LeafIssuer.load(o.caCert, o.caKey));
}

/** One terminated tunnel, as its requests see it. */
interface Tunnel {
  target: PinnedTarget;
  flow: Flow;
  srcPort: number;
  /** Requests whose answer has not closed yet. */
  open: number;
  requests: number;
  /** The flows of the requests in flight. */
  inner: Set<Flow>;
  /** Their answers (a retired tunnel's are sent with `connection: close`). */
  answers: Set<ServerResponse>;
  /** Its credential ended (retire): no new request, closed once the last in flight is answered. */
  retired: boolean;
  clientClosed: boolean;
  settle(): void;
}

const CLIENT_ERRORS: Record<string, [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'Request Header Fields Too Large', 'request headers too large'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'Request Timeout', 'request not received in time'],
};

export class TlsInterceptor implements Interceptor {
  readonly #deps: GatewayDeps;
  readonly #issuer: LeafIssuer;
  readonly #http: http.Server;
  readonly #tunnels = new WeakMap<Duplex, Tunnel>();
  readonly #clients = new Map<Duplex, Tunnel>();

  constructor(deps: GatewayDeps, issuer: LeafIssuer) {
    this.#deps = deps;
    this.#issuer = issuer;
    const o = deps.options;
    this.#http = http.createServer({ ...serverOptions(o), requireHostHeader: true });
    this.#http.setTimeout(o.idleTimeout);
    this.#http.on('request', (req: IncomingMessage, res: ServerResponse) => this.#request(req, res));
    // Between requests (keep-alive) and with nothing in flight (idle): closed. A request in flight is
    // bounded by the exchange (--upstream-timeout, and --idle-timeout for an agent that stops reading).
    this.#http.on('timeout', (socket: Duplex) => {
      if ((this.#tunnels.get(socket)?.open ?? 0) > 0) return;
      socket.destroy();
    });
    this.#http.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => this.#clientError(err, socket));
    // node enforces the header and request deadlines from a timer it starts when its server listens;
    // this one never listens (its connections are the tunnels'), so it is told it does.
    this.#http.emit('listening');
  }

  /** Leaves minted so far (leaf-issuer.ts). */
  get leavesMinted(): number {
    return this.#issuer.minted;
  }

  wants(target: Target): boolean {
    const d = this.#deps;
    if (routedKind(d, target.host, target.port) !== 'destination') return true;
    if (rulesFor(d.injectRules, target.host, target.port).length > 0) return true;
    return captures(d.options, target.host);
  }

  serve(client: Duplex, head: Buffer, target: PinnedTarget, tunnel: Flow): Promise<void> {
    const d = this.#deps;
    const o = d.options;
    tunnel.attrs.intercepted = 'true';
    return new Promise<void>((resolve) => {
      const state: Tunnel = {
        target,
        flow: tunnel,
        srcPort: Number(tunnel.src.slice(tunnel.src.lastIndexOf(':') + 1)) || 0,
        open: 0,
        requests: 0,
        inner: new Set(),
        answers: new Set(),
        retired: false,
        clientClosed: false,
        settle: () => {
          if (state.clientClosed && state.open === 0) resolve();
        },
      };
      if (client.destroyed) {
        resolve();
        return;
      }
      let secure = false;
      const timer = setTimeout(() => {
        tunnel.attrs.tls_error ||= `TLS handshake not completed within ${o.tlsHandshakeTimeout} ms`;
        client.destroy();
      }, o.tlsHandshakeTimeout);
      this.#clients.set(client, state);
      client.on('error', (err) => d.log.debug({ err, flow_id: tunnel.id }, 'intercepted tunnel socket failed'));
      client.once('close', () => {
        clearTimeout(timer);
        this.#clients.delete(client);
        state.clientClosed = true;
        state.settle();
      });
      // The bytes that came with the CONNECT (the start of the ClientHello) are the TLS layer's to read first.
      if (head.length > 0) client.unshift(head);
      this.#issuer.context(target.host).then(
        (context) => {
          if (client.destroyed) return;
          const socket = new TLSSocket(client, {
            isServer: true,
            secureContext: context,
            ALPNProtocols: ['http/1.1'],
            // Every decision was taken for the CONNECT host: a handshake for another name is refused.
            SNICallback: (servername, cb) => {
              if (canonicalHost(servername) === target.host) cb(null, context);
              else {
                tunnel.attrs.tls_error = `the TLS server name ${servername.slice(0, 255)} is not the CONNECT host`;
                cb(new Error(tunnel.attrs.tls_error));
              }
            },
          });
          socket.on('error', (err: NodeJS.ErrnoException) => {
            if (!secure) tunnel.attrs.tls_error ||= `TLS handshake failed: ${err.code ?? err.message}`;
            client.destroy();
          });
          socket.once('close', () => client.destroy());
          socket.once('secure', () => {
            secure = true;
            clearTimeout(timer);
            this.#tunnels.set(socket, state);
            this.#http.emit('connection', socket);
          });
        },
        (err: unknown) => {
          d.log.error({ err, flow_id: tunnel.id, host: target.host }, 'no leaf certificate minted for the host');
          tunnel.attrs.tls_error = 'no certificate could be minted for the host';
          client.destroy();
        },
      );
    });
  }

  #request(req: IncomingMessage, res: ServerResponse): void {
    const state = this.#tunnels.get(req.socket);
    // A retired tunnel takes no new request (one pipelined behind the last answer).
    if (state === undefined || state.retired) {
      res.destroy();
      return;
    }
    const flow = new Flow('https', { address: state.flow.srcIp, port: state.srcPort }, state.target);
    flow.identity = state.flow.identity;
    flow.dstIp = state.target.address;
    state.open++;
    state.requests++;
    state.inner.add(flow);
    state.answers.add(res);
    state.flow.attrs.requests = String(state.requests);
    res.once('close', () => {
      state.inner.delete(flow);
      state.answers.delete(res);
      state.flow.bytesUp += flow.bytesUp;
      state.flow.bytesDown += flow.bytesDown;
      state.open--;
      state.settle();
      if (state.retired && state.open === 0) req.socket.destroy();
    });
    this.#deps.exchange(req, res, state.target, 'https', flow);
  }

  /** A request node refused inside a tunnel (malformed, oversized headers, too slow): answered, then closed. */
  #clientError(err: NodeJS.ErrnoException, socket: Duplex): void {
    const state = this.#tunnels.get(socket);
    if (err.code === 'ECONNRESET' || socket.destroyed) return;
    const [status, text, message] = CLIENT_ERRORS[err.code ?? ''] ?? [400, 'Bad Request', 'malformed request'];
    if (state) state.flow.attrs.http_error = `${status} ${err.code ?? 'malformed'}`;
    this.#deps.log.debug({ err, flow_id: state?.flow.id, status }, 'request refused inside an intercepted tunnel');
    const sent = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent;
    if (!socket.writable || sent) {
      socket.destroy();
      return;
    }
    const { body, contentType } = jsonAnswer(status, 'invalid_request_error', message);
    socket.end(
      `HTTP/1.1 ${status} ${text}\r\ncontent-type: ${contentType}\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body.toString()}`,
      () => socket.destroy(),
    );
    // A peer that never reads must not keep the socket by not draining it.
    setTimeout(() => socket.destroy(), 1000).unref();
  }

  cut(client: Duplex, reason: string): Flow[] {
    const state = this.#clients.get(client);
    if (state === undefined) return [];
    const inner = [...state.inner];
    for (const flow of inner) if (!flow.recorded) flow.cutReason ??= reason;
    return inner;
  }

  retire(client: Duplex, graceMs: number, onOverdue: () => void): boolean {
    const state = this.#clients.get(client);
    if (state === undefined || state.open === 0) return true;
    state.retired = true;
    for (const res of state.answers) res.shouldKeepAlive = false;
    const timer = setTimeout(() => {
      if (!state.clientClosed) onOverdue();
    }, graceMs);
    timer.unref();
    client.once('close', () => clearTimeout(timer));
    return false;
  }

  async close(): Promise<void> {
    for (const client of this.#clients.keys()) client.destroy();
    this.#clients.clear();
    // Not listening: close() clears node's deadline timer and answers "not running", which is expected.
    await new Promise<void>((resolve) => this.#http.close(() => resolve()));
  }
}
