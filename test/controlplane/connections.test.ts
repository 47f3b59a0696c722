import t from 'tap';
import net from 'node:net';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request, Agent } from 'undici';
import { createLogger } from '../../core/logger.ts';
import { generateCa, issueCertificate } from '../../core/tls.ts';
import { startControlPlane } from '../../controlplane/server.ts';
import { openTls, parseRawAnswer } from '../fixtures/raw-tls.ts';

// The control plane closes what an unauthenticated client could otherwise hold forever (the same
// core/server-limits.ts as llmproxy), with real sockets against a control plane in skeleton mode:
// no TLS handshake, a handshake and then nothing (idle bound shorter than the headers bound here),
// half a header, and more connections from one address than allowed. Only generous "closed within".
const dir = await mkdtemp(join(tmpdir(), 'dvx-cp-conn-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const ca = await generateCa();
const leaf = await issueCertificate(ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
await writeFile(join(dir, 'cert.pem'), leaf.certPem);
await writeFile(join(dir, 'key.pem'), leaf.keyPem);
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const cp = await startControlPlane(
  {
    addr: '127.0.0.1:0',
    tlsCert: join(dir, 'cert.pem'),
    tlsKey: join(dir, 'key.pem'),
    tlsHandshakeTimeout: 300,
    idleTimeout: 300,
    headersTimeout: 1_000,
    requestTimeout: 2_000,
    keepAliveTimeout: 300,
    maxConnectionsPerClient: 3,
    metricsAddr: '127.0.0.1:0',
  },
  { logger: quiet },
);
t.teardown(() => cp.close());

t.test('a TCP connection that never starts TLS is closed', async (t) => {
  const closed = await new Promise<boolean>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port: cp.port });
    const timer = setTimeout(() => {
      s.destroy();
      resolve(false);
    }, 10_000);
    s.on('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
    s.on('error', () => {});
  });
  t.ok(closed);
});

t.test('a TLS connection that sends nothing is closed', async (t) => {
  const c = await openTls(cp.port, { ca: ca.certPem });
  t.ok((await c.closed(10_000)).closed);
});

t.test('half a header, then nothing: closed (408 Problem if answered)', async (t) => {
  const c = await openTls(cp.port, { ca: ca.certPem });
  c.socket.write('GET /healthz HTTP/1.1\r\nhost: x\r\n');
  const r = await c.closed(10_000);
  t.ok(r.closed);
  if (r.text) {
    const a = parseRawAnswer(r.text);
    t.equal(a.status, 408);
    t.match(JSON.parse(a.body), { type: 'https://dvx.dev/problems/request-timeout', status: 408 });
  }
});

t.test('connections from one address past the bound are closed at accept', async (t) => {
  const held = [];
  for (let i = 0; i < 3; i++) {
    const c = await openTls(cp.port, { ca: ca.certPem });
    held.push(c);
  }
  await t.rejects(openTls(cp.port, { ca: ca.certPem }), 'the fourth is refused');
  const other = await openTls(cp.port, { ca: ca.certPem, localAddress: '127.0.0.2' });
  t.ok(other.socket.authorized, 'another address still gets in');
  for (const c of [...held, other]) c.socket.destroy();
});

t.test("the metrics listener is bounded too, and the control plane's connections are counted", async (t) => {
  const c = await openTls(cp.metricsPort!, { ca: ca.certPem });
  t.ok((await c.closed(10_000)).closed, 'a silent connection to the metrics listener is closed');
  const dispatcher = new Agent({ connect: { ca: ca.certPem } });
  t.teardown(() => dispatcher.close());
  const text = await (await request(`https://127.0.0.1:${cp.metricsPort}/metrics`, { dispatcher })).body.text();
  t.match(text, /dvx_connections_refused_total\{listener="controlplane",reason="per_client"\} 1/);
  t.match(text, /dvx_connections_reaped_total\{listener="controlplane",reason="handshake_timeout"\} [1-9]/);
  t.match(text, /dvx_connections_reaped_total\{listener="controlplane",reason="idle"\} [1-9]/);
  t.match(text, /dvx_connections_open\{listener="controlplane"\} \d/);
  t.match(text, /dvx_connections_reaped_total\{listener="metrics",reason="idle"\} [1-9]/);
});
