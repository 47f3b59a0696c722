import net from 'node:net';
import { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Flow } from '../../../proxy/egress/context.ts';
import type { Harness } from './intercept-harness.ts';

// A raw client of the test door: CONNECT, then TLS inside, with the ClientHello sent in the same
// write as the CONNECT (so the door's `head` holds it) and any SNI and ALPN the test asks for.

export interface TunnelOptions {
  servername?: string;
  alpn?: string[];
  /** Send the CONNECT and stop there (no TLS): a client that never starts its handshake. */
  noTls?: boolean;
}

export interface RawTunnel {
  tls: tls.TLSSocket | null;
  raw: net.Socket;
  /** The client's port (how the door's flow names it). */
  port: number;
  /** Resolves when the door closes the connection. */
  closed: Promise<void>;
}

/** The client port of the last tunnel opened (to find the flow of one whose handshake failed). */
export let lastPort = 0;

export async function openTunnel(h: Harness, host: string, port: number, o: TunnelOptions = {}): Promise<RawTunnel> {
  const raw = net.connect({ host: '127.0.0.1', port: h.doorPort });
  await new Promise<void>((resolve, reject) => {
    raw.once('connect', resolve);
    raw.once('error', reject);
  });
  raw.on('error', () => undefined);
  lastPort = raw.localPort ?? 0;
  const closed = new Promise<void>((resolve) => raw.once('close', () => resolve()));
  const connect = Buffer.from(`CONNECT ${host}:${port} HTTP/1.1\r\nHost: ${host}:${port}\r\n\r\n`);
  if (o.noTls) {
    raw.resume(); // the door's 200 is read, so its close is seen
    raw.write(connect);
    return { tls: null, raw, port: lastPort, closed };
  }
  let first = true;
  let established = false;
  let buffered = Buffer.alloc(0);
  const pipe: Duplex = new Duplex({
    write(chunk: Buffer, _enc, cb) {
      if (first) {
        first = false;
        raw.write(Buffer.concat([connect, chunk]), cb);
      } else raw.write(chunk, cb);
    },
    read() {},
    destroy(err, cb) {
      raw.destroy();
      cb(err);
    },
  });
  raw.on('data', (d: Buffer) => {
    if (established) {
      pipe.push(d);
      return;
    }
    buffered = Buffer.concat([buffered, d]);
    const at = buffered.indexOf('\r\n\r\n');
    if (at < 0) return;
    established = true;
    if (!/^HTTP\/1\.1 200/.test(buffered.toString('latin1'))) {
      pipe.destroy(new Error(`CONNECT refused: ${buffered.toString('latin1', 0, at)}`));
      return;
    }
    const rest = buffered.subarray(at + 4);
    if (rest.length > 0) pipe.push(rest);
  });
  raw.on('end', () => pipe.push(null));
  raw.on('close', () => pipe.destroy());
  const socket = tls.connect({
    socket: pipe,
    servername: o.servername ?? host,
    ca: h.gatewayCa.certPem,
    ALPNProtocols: o.alpn,
    checkServerIdentity: (_name, cert) => tls.checkServerIdentity(host, cert),
  });
  await new Promise<void>((resolve, reject) => {
    socket.once('secureConnect', resolve);
    socket.once('error', reject);
    socket.once('close', () => reject(new Error('closed before the handshake completed')));
  });
  return { tls: socket, raw, port: lastPort, closed };
}

/** The tunnel's own flow once serve() has resolved for it (found by the client's port). */
export function tunnelFlow(h: Harness, tunnel: RawTunnel | number): Flow | undefined {
  const port = typeof tunnel === 'number' ? tunnel : tunnel.port;
  return h.tunnels.find((f) => f.src === `127.0.0.1:${port}`);
}

/** Whether `text` holds `count` complete answers (each with a Content-Length, or the last one ended by close). */
function answers(text: string, count: number): boolean {
  let at = 0;
  for (let i = 0; i < count; i++) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end < 0) return false;
    const length = /\r\ncontent-length: *(\d+)/i.exec(text.slice(at, end));
    if (length === null) return false;
    at = end + 4 + Number(length[1]);
    if (text.length < at) return false;
  }
  return true;
}

/**
 * Sends raw HTTP bytes in the tunnel and collects what comes back until `count` complete answers have
 * arrived, the door closes, or `withinMs` passes; then closes the tunnel.
 */
export async function exchangeRaw(tunnel: RawTunnel, request: string, count = 1, withinMs = 10_000): Promise<string> {
  const socket = tunnel.tls!;
  let text = '';
  let done: () => void = () => undefined;
  const finished = new Promise<void>((resolve) => {
    done = resolve;
  });
  socket.on('data', (d: Buffer) => {
    text += d.toString('latin1');
    if (answers(text, count)) done();
  });
  socket.on('error', () => undefined);
  socket.once('close', () => done());
  socket.write(request);
  const timer = setTimeout(done, withinMs);
  await finished;
  clearTimeout(timer);
  socket.destroy();
  return text;
}
