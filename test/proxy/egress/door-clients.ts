import { once } from 'node:events';
import tls from 'node:tls';
import type { GatewayHarness } from './gateway-harness.ts';

// Raw agents for the door's attack tests: a CONNECT over TLS to the gateway that stays open once the
// gateway answered (to hold a tunnel while the test changes the world around it), and the records of
// one flow.

export interface HeldConnection {
  socket: tls.TLSSocket;
  /** The status of the gateway's answer. */
  status: number;
  /** Everything received so far (the answer's head included). */
  received(): string;
  /** Resolves when the gateway closed the connection. */
  closed: Promise<void>;
}

/**
 * Sends `request` (a CONNECT, or an absolute-form request) over a fresh TLS connection to the gateway
 * and resolves once the answer's head has come; the connection stays open.
 */
export async function holdConnection(
  h: GatewayHarness,
  request: string,
  tlsOptions: tls.ConnectionOptions = {},
): Promise<HeldConnection> {
  const socket = tls.connect({
    host: '127.0.0.1',
    port: h.port,
    ca: h.ca.certPem,
    servername: 'localhost',
    ...tlsOptions,
  });
  socket.on('error', () => {});
  let got = '';
  socket.on('data', (d: Buffer) => {
    got += d.toString('latin1');
  });
  const closed = once(socket, 'close').then(() => {});
  await once(socket, 'secureConnect');
  socket.write(request);
  while (!got.includes('\r\n\r\n')) {
    const more = await Promise.race([once(socket, 'data').then(() => true), closed.then(() => false)]);
    if (!more) break;
  }
  return {
    socket,
    status: Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0),
    received: () => got,
    closed,
  };
}

export function connectRequest(authority: string, token: string | null): string {
  return `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${token ? `Proxy-Authorization: Bearer ${token}\r\n` : ''}\r\n`;
}

/** The network_flow records of one flow id. */
export function flowsOf(h: GatewayHarness, id: unknown): Record<string, unknown>[] {
  return h.audit.filter((r) => r.table === 'network_flow' && r.id === id);
}

/** The network_flow records so far. */
export function flows(h: GatewayHarness): Record<string, unknown>[] {
  return h.audit.filter((r) => r.table === 'network_flow');
}

/**
 * One HTTP/1.1 exchange on an open connection (kept alive between calls): writes `request`, reads one
 * answer (a content-length or chunked body). Rejects when the connection closes first.
 */
export function exchangeOn(
  socket: tls.TLSSocket,
  request: string,
): Promise<{ status: number; headers: Record<string, string>; body: string }> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const done = (answer: { status: number; headers: Record<string, string>; body: string }) => {
      socket.off('data', onData);
      socket.off('close', onClose);
      resolve(answer);
    };
    const onClose = () => {
      socket.off('data', onData);
      reject(new Error(`connection closed before an answer: ${buf.toString('latin1').slice(0, 200)}`));
    };
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const [line, ...rest] = buf.subarray(0, end).toString('latin1').split('\r\n');
      const headers: Record<string, string> = {};
      for (const l of rest) {
        const c = l.indexOf(':');
        if (c > 0) headers[l.slice(0, c).trim().toLowerCase()] = l.slice(c + 1).trim();
      }
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(line)?.[1] ?? 0);
      const body = buf.subarray(end + 4);
      if (headers['content-length'] !== undefined) {
        const n = Number(headers['content-length']);
        if (body.length >= n) done({ status, headers, body: body.subarray(0, n).toString('utf8') });
        return;
      }
      if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
        let at = 0;
        let out = '';
        for (;;) {
          const nl = body.indexOf('\r\n', at);
          if (nl < 0) return;
          const size = Number.parseInt(body.subarray(at, nl).toString('latin1'), 16);
          if (size === 0) {
            if (body.indexOf('\r\n\r\n', nl - 2) < 0) return;
            done({ status, headers, body: out });
            return;
          }
          if (body.length < nl + 2 + size + 2) return;
          out += body.subarray(nl + 2, nl + 2 + size).toString('utf8');
          at = nl + 2 + size + 2;
        }
      }
      done({ status, headers, body: body.toString('utf8') });
    };
    socket.on('data', onData);
    socket.on('close', onClose);
    socket.write(request);
  });
}

/** Whether the gateway closed `c` within `ms` (a bound, so that a connection never cut fails the test, not hangs it). */
export function closedWithin(c: HeldConnection, ms = 10_000): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    c.closed.then(() => true),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
