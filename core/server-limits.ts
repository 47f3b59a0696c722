import type { Server as HttpsServer } from 'node:https';
import type { Server as HttpServer, IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Registry } from 'prom-client';
import type { Logger } from './logger.ts';
import { counter, gauge } from './metrics.ts';

// The connection bounds every TLS listener of dvx shares (llmproxy, its metrics listener, the control
// plane): an unauthenticated client must not be able to hold file descriptors for free.
//
//   accept ─▶ per-client and total count (refused: closed at once, counted)
//          ─▶ TLS handshake within tlsHandshakeTimeout
//          ─▶ complete request headers within headersTimeout, whole request within requestTimeout
//             (node checks both every connectionsCheckingInterval, so that interval is kept small)
//          ─▶ between requests: keepAliveTimeout; no traffic and no response in flight: idleTimeout
//          ─▶ a response the client stops reading (bytes unsent, none taken for idleTimeout): closed
//
// A client error (oversized headers, a malformed request, a request that did not arrive in time) is
// answered in the listener's own format (`answer`), then the connection is closed.

export interface ServerLimitOptions {
  /** Time from TCP accept to a completed TLS handshake. */
  tlsHandshakeTimeout: number;
  /** Time from the connection (or the previous response) to the complete request header. */
  headersTimeout: number;
  /** Time to receive the whole request, body included. */
  requestTimeout: number;
  /** Idle time between two requests on a kept-alive connection. */
  keepAliveTimeout: number;
  /**
   * A connection with no traffic and no response in flight for this long is closed; so is one whose
   * client has taken none of its response's unsent bytes for this long.
   */
  idleTimeout: number;
  /** Open connections per listener; past it a new one is closed at accept. */
  maxConnections: number;
  /** Open connections per client address; past it a new one is closed at accept. */
  maxConnectionsPerClient: number;
}

export const SERVER_LIMIT_DEFAULTS: ServerLimitOptions = {
  tlsHandshakeTimeout: 10_000,
  headersTimeout: 30_000,
  requestTimeout: 120_000,
  keepAliveTimeout: 65_000,
  idleTimeout: 60_000,
  maxConnections: 10_000,
  maxConnectionsPerClient: 256,
};

/** What is wrong with the connection bounds, or null (flag names as the operator typed them). */
export function serverLimitsProblem(o: ServerLimitOptions): string | null {
  for (const [key, name] of [
    ['tlsHandshakeTimeout', 'tls-handshake-timeout'],
    ['headersTimeout', 'headers-timeout'],
    ['requestTimeout', 'request-timeout'],
    ['keepAliveTimeout', 'keep-alive-timeout'],
    ['idleTimeout', 'idle-timeout'],
  ] as const) {
    if (!(o[key] > 0) || !Number.isFinite(o[key])) return `--${name} must be a positive duration`;
  }
  if (o.headersTimeout > o.requestTimeout) return '--headers-timeout must not exceed --request-timeout';
  if (!Number.isInteger(o.maxConnections) || o.maxConnections < 1)
    return '--max-connections must be a positive integer';
  if (!Number.isInteger(o.maxConnectionsPerClient) || o.maxConnectionsPerClient < 1)
    return '--max-connections-per-client must be a positive integer';
  return null;
}

/** A client error's answer on the wire, in the listener's own format. */
export interface ClientErrorAnswer {
  contentType: string;
  body: string;
}

export type ClientErrorReason = 'header_overflow' | 'request_timeout' | 'malformed';

export interface ServerLimitDeps {
  /** The listener's name in metrics and logs: `llmproxy`, `controlplane`, `metrics`. */
  listener: string;
  registry: Registry;
  log: Logger;
  /** The body of a client-error answer with this status (431, 408 or 400). */
  answer(status: number, reason: ClientErrorReason): ClientErrorAnswer;
}

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  408: 'Request Timeout',
  431: 'Request Header Fields Too Large',
};

/** The node server options the bounds map to (https.createServer, or fastify's `https`). */
export function serverOptions(o: ServerLimitOptions) {
  return {
    handshakeTimeout: o.tlsHandshakeTimeout,
    headersTimeout: o.headersTimeout,
    requestTimeout: o.requestTimeout,
    keepAliveTimeout: o.keepAliveTimeout,
    // node looks for expired headers/requests on this interval (30 s by default, which would double
    // a 30 s bound); a quarter of the headers bound, between 50 ms and 1 s.
    connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(o.headersTimeout / 4))),
  };
}

/** Normalized client address: an IPv4-mapped IPv6 address counts as its IPv4 address. */
function clientOf(socket: Socket): string {
  const addr = socket.remoteAddress ?? '';
  return addr.startsWith('::ffff:') ? addr.slice(7) : addr;
}

// Connections closed because their client stopped reading, so that the handler whose response was cut
// can say so in its record (`closedForSendStall`).
const sendStalled = new WeakSet<object>();

/** Whether the limiter closed this connection because its client stopped reading its response. */
export function closedForSendStall(socket: object | null | undefined): boolean {
  return socket != null && sendStalled.has(socket);
}

export class ServerLimiter {
  readonly #o: ServerLimitOptions;
  readonly #deps: ServerLimitDeps;
  readonly #perClient = new Map<string, number>();
  readonly #inFlight = new WeakMap<Duplex, number>();
  #open = 0;
  readonly #metrics;

  constructor(options: ServerLimitOptions, deps: ServerLimitDeps) {
    this.#o = options;
    this.#deps = deps;
    this.#metrics = {
      open: gauge(deps.registry, 'dvx_connections_open', 'Open client connections by listener', ['listener']),
      refused: counter(
        deps.registry,
        'dvx_connections_refused_total',
        'Connections closed at accept, by listener and reason (max_connections, per_client)',
        ['listener', 'reason'],
      ),
      closed: counter(
        deps.registry,
        'dvx_connections_reaped_total',
        'Connections the server closed, by listener and reason (handshake_timeout, request_timeout, idle, send_stall, header_overflow, malformed)',
        ['listener', 'reason'],
      ),
    };
    this.#metrics.open.set({ listener: deps.listener }, 0);
  }

  /** Open connections right now (accepted and not yet closed). */
  get open(): number {
    return this.#open;
  }

  /**
   * Installs the bounds on a server created with serverOptions() and not yet listening;
   * `clientErrors: false` when the framework owns that event (fastify: pass `clientError` as its
   * clientErrorHandler). A plain HTTP server (imds, on a unix socket) takes the same bounds but the
   * handshake one.
   */
  attach(server: HttpsServer | HttpServer, { clientErrors = true }: { clientErrors?: boolean } = {}): void {
    const o = this.#o;
    const listener = this.#deps.listener;
    // The handshake, header, request and keep-alive bounds are constructor options (serverOptions());
    // the idle bound and the caps are set here.
    server.setTimeout(o.idleTimeout);
    server.maxConnections = o.maxConnections;
    server.on('drop', () => this.#metrics.refused.inc({ listener, reason: 'max_connections' }));
    // Before TLS wraps the socket: a refused connection costs no handshake.
    server.prependListener('connection', (socket: Socket) => {
      const client = clientOf(socket);
      const n = this.#perClient.get(client) ?? 0;
      if (n >= o.maxConnectionsPerClient) {
        this.#metrics.refused.inc({ listener, reason: 'per_client' });
        socket.destroy();
        return;
      }
      this.#perClient.set(client, n + 1);
      this.#open++;
      this.#metrics.open.inc({ listener });
      socket.once('close', () => {
        const left = (this.#perClient.get(client) ?? 1) - 1;
        if (left > 0) this.#perClient.set(client, left);
        else this.#perClient.delete(client);
        this.#open--;
        this.#metrics.open.dec({ listener });
      });
    });
    server.on('tlsClientError', (err: NodeJS.ErrnoException) => {
      if (err.code === 'ERR_TLS_HANDSHAKE_TIMEOUT') this.#metrics.closed.inc({ listener, reason: 'handshake_timeout' });
    });
    // A response in flight keeps its connection: how long a call may take is the handler's bound
    // (an LLM call can be silent for minutes), not the idle one.
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      const socket = req.socket;
      this.#inFlight.set(socket, (this.#inFlight.get(socket) ?? 0) + 1);
      res.once('close', () => this.#inFlight.set(socket, (this.#inFlight.get(socket) ?? 1) - 1));
    });
    // With a listener here node no longer closes a timed-out socket itself: keep-alive and idle
    // timeouts both land here.
    //
    // The timer restarts on every write that starts and every one that completes, so when it fires on
    // a connection with bytes still unsent, the client has taken nothing for the whole bound: it
    // stopped reading. Its response would hold the connection (and what feeds it: an upstream, a
    // buffer) for ever, since node does not re-arm the timer without activity: closed ("send_stall").
    // A slow reader that keeps taking bytes restarts the timer and is never cut. Progress is a write
    // *completing*, and one write completes only once the client has taken nearly all of it (past the
    // kernel's socket buffer): a handler writes a large body in pieces (llmproxy's send(), 64 KB), or a
    // steady slow reader of one large write is cut. (No finer signal exists: the TLS layer hands the
    // whole write to the kernel's queue at once, whose progress node does not expose.)
    server.on('timeout', (socket: Duplex) => {
      if ((this.#inFlight.get(socket) ?? 0) > 0) {
        if (socket.writableLength === 0) return;
        this.#metrics.closed.inc({ listener, reason: 'send_stall' });
        this.#deps.log.info(
          { listener, unsent_bytes: socket.writableLength, idle_ms: o.idleTimeout },
          'client stopped reading its response; connection closed',
        );
        sendStalled.add(socket);
        socket.destroy();
        return;
      }
      this.#metrics.closed.inc({ listener, reason: 'idle' });
      socket.destroy();
    });
    if (clientErrors) server.on('clientError', this.clientError);
  }

  /** The answer to a client error (node's `clientError` event), then the connection is closed. */
  readonly clientError = (err: NodeJS.ErrnoException, socket: Duplex): void => {
    if (err.code === 'ECONNRESET' || socket.destroyed) return;
    const [status, reason]: [number, ClientErrorReason] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'header_overflow']
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'request_timeout']
          : [400, 'malformed'];
    this.#metrics.closed.inc({ listener: this.#deps.listener, reason });
    this.#deps.log.debug({ err, listener: this.#deps.listener, status }, 'client error; connection closed');
    const sent = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent;
    if (!socket.writable || sent) {
      socket.destroy();
      return;
    }
    const { contentType, body } = this.#deps.answer(status, reason);
    const head = `HTTP/1.1 ${status} ${STATUS_TEXT[status]}\r\ncontent-type: ${contentType}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n`;
    socket.end(head + body, () => socket.destroy());
    // A peer that never reads must not keep the socket by not draining it.
    setTimeout(() => socket.destroy(), 1000).unref();
  };
}
