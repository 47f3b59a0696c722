import { STATUS_CODES } from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import type { Flow, GatewayDeps, PinnedTarget } from './context.ts';
import { ANSWERS, type GatewayAnswer } from './errors.ts';
import { recordFlow } from './flow-record.ts';

// A blind tunnel (docs/gateway.md, "Tunnels"): the agent's CONNECT, once admitted, joined byte for byte
// to a TCP connection the gateway opens to the address the policy checked (never the name: nothing
// resolves it again).
//
//   agent ══TLS══ gateway ──CONNECT host:port──▶ admitted, pinned to address
//                    └─ net.connect(address, port) within --connect-timeout
//                         ├─ refused / unreachable ─▶ 502 `Upstream request failed`, closed
//                         ├─ too slow ─────────────▶ 504, closed
//                         └─ connected ─▶ `200 Connection Established`, then bytes both ways
//
// Both sides may half-close (a FIN passes through; the other direction goes on). A tunnel with no byte
// either way for --tunnel-idle-timeout is closed; an error or a close on either side ends both. The
// flow's record (bytes each way, duration, why it ended) is appended once both sides are closed.

const ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n';
/** How long the peer of a closed side gets to take what is still to be written to it before it is destroyed. */
const END_GRACE_MS = 5_000;
/** How long a refused CONNECT's client gets to read the answer before its connection is destroyed. */
const ANSWER_LINGER_MS = 2_000;

/**
 * A full HTTP/1.1 answer on a CONNECT's socket (which no HTTP response object owns), then the
 * connection is closed: what the client sent meanwhile is read and dropped, so the close is not a reset
 * that could lose the answer.
 */
export function answerSocket(socket: Duplex, answer: GatewayAnswer, headers: Record<string, string> | null): void {
  if (socket.destroyed || !socket.writable) {
    socket.destroy();
    return;
  }
  let head = `HTTP/1.1 ${answer.status} ${STATUS_CODES[answer.status] ?? 'Error'}\r\ncontent-type: ${answer.contentType}\r\ncontent-length: ${answer.body.length}\r\nconnection: close\r\n`;
  for (const [k, v] of Object.entries(headers ?? {})) head += `${k}: ${v}\r\n`;
  socket.resume();
  socket.end(Buffer.concat([Buffer.from(`${head}\r\n`, 'latin1'), answer.body]));
  const timer = setTimeout(() => socket.destroy(), ANSWER_LINGER_MS);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
}

/** A blind tunnel, as the gateway holds it. */
export interface BlindTunnel {
  /**
   * Ends it now (a snapshot reload refuses it, the shutdown grace is over): both sides destroyed at
   * once, the record written with `reason` (unless it was already ending for a reason of its own).
   * Before the destination connected, the agent gets `answer` (with `headers`) instead of `200`.
   */
  cut(reason: string, answer: GatewayAnswer, headers?: Record<string, string> | null): Flow[];
}

/** Opens the tunnel for an admitted CONNECT; the flow is recorded once both sides have closed. */
export function openTunnel(
  deps: GatewayDeps,
  client: net.Socket,
  head: Buffer,
  target: PinnedTarget,
  flow: Flow,
): BlindTunnel {
  const { connectTimeout, tunnelIdleTimeout } = deps.options;
  const metrics = deps.metrics;
  flow.dstIp = target.address;
  const where = `${target.family === 6 ? `[${target.address}]` : target.address}:${target.port}`;
  const upstream = net.connect({
    host: target.address,
    port: target.port,
    family: target.family,
    allowHalfOpen: true,
    noDelay: true,
  });
  let connected = false;
  /** What ended the tunnel other than its two peers closing in order (the record's reason); null if nothing. */
  let ending: string | null = null;
  let closed = 0;
  const end = (why: string) => {
    if (ending === null) ending = why;
  };
  const finish = () => {
    if (++closed < 2) return;
    clearTimeout(graceTimer);
    if (connected) metrics.tunnelsOpen.dec({ kind: 'blind' });
    if (ending) flow.reason = ending;
    recordFlow(deps, flow);
  };
  let graceTimer: NodeJS.Timeout | undefined;
  /** One side closed: the other finishes what it has, within a grace. */
  const peerClosed = (other: Duplex) => {
    if (other.destroyed) return;
    if (other.writableFinished) {
      other.destroy();
      return;
    }
    other.once('finish', () => other.destroy());
    other.end();
    graceTimer = setTimeout(() => other.destroy(), END_GRACE_MS);
    graceTimer.unref();
  };

  /** The connection could not be opened: the client gets the answer, the flow a refusal. */
  const failed = (answer: GatewayAnswer, reason: string, headers: Record<string, string> | null = null) => {
    if (ending !== null) return;
    end(reason);
    flow.outcome = 'deny';
    flow.attrs.status = String(answer.status);
    metrics.refusals.inc({ status: String(answer.status) });
    deps.log.info({ flow_id: flow.id, dst: flow.dst, reason }, 'tunnel not opened');
    upstream.destroy();
    answerSocket(client, answer, headers);
  };
  // --connect-timeout bounds resolution and connection together: the connection gets what is left.
  const connectTimer = setTimeout(
    () => failed(ANSWERS.upstreamTimeout, `${where} not connected within --connect-timeout (${connectTimeout} ms)`),
    Math.max(1, connectTimeout - (performance.now() - flow.started)),
  );

  upstream.once('connect', () => {
    clearTimeout(connectTimer);
    if (ending !== null || client.destroyed) {
      upstream.destroy();
      return;
    }
    connected = true;
    metrics.tunnelsOpen.inc({ kind: 'blind' });
    flow.attrs.status = '200';
    client.write(ESTABLISHED);
    if (head.length > 0) {
      flow.bytesUp += head.length;
      upstream.write(head);
    }
    client.on('data', (chunk: Buffer) => {
      flow.bytesUp += chunk.length;
    });
    upstream.on('data', (chunk: Buffer) => {
      flow.bytesDown += chunk.length;
    });
    // The server's TLS sockets end their side when the client ends its own; a tunnel's half-close must
    // pass through instead (the destination may still answer).
    client.allowHalfOpen = true;
    client.pipe(upstream);
    upstream.pipe(client);
    client.setTimeout(tunnelIdleTimeout);
    upstream.setTimeout(tunnelIdleTimeout);
    const idle = () => {
      end(`idle for ${tunnelIdleTimeout} ms`);
      client.destroy();
      upstream.destroy();
    };
    client.on('timeout', idle);
    upstream.on('timeout', idle);
  });

  upstream.on('error', (err: NodeJS.ErrnoException) => {
    clearTimeout(connectTimer);
    if (!connected) {
      failed(ANSWERS.upstreamFailed, `cannot connect to ${where}: ${err.code ?? err.message}`);
      return;
    }
    end(`destination error: ${err.code ?? err.message}`);
    client.destroy();
  });
  client.on('error', (err: NodeJS.ErrnoException) => {
    end(`agent connection error: ${err.code ?? err.message}`);
    upstream.destroy();
  });
  upstream.once('close', () => {
    clearTimeout(connectTimer);
    if (connected) peerClosed(client);
    finish();
  });
  client.once('close', () => {
    clearTimeout(connectTimer);
    if (!connected) {
      end('the agent closed its connection before the destination answered');
      upstream.destroy();
    } else peerClosed(upstream);
    finish();
  });
  // The agent left while its attempt was admitted, before the tunnel was opened: its 'close' has come
  // and gone, so nothing above would end the tunnel; no connection is opened for it.
  if (client.destroyed) {
    end('the agent closed its connection before the destination answered');
    upstream.destroy();
    finish();
  }

  return {
    cut(reason, answer, headers = null) {
      if (flow.recorded) return [];
      // The first reason stands: a tunnel already ending (a side closed, a failure) keeps its own.
      if (ending === null && closed === 0) flow.cutReason ??= reason;
      if (!connected) {
        clearTimeout(connectTimer);
        failed(answer, reason, headers);
        upstream.destroy();
        return [];
      }
      end(reason);
      clearTimeout(graceTimer);
      client.destroy();
      upstream.destroy();
      return [];
    },
  };
}
