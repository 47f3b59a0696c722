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
