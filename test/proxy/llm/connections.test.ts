import t from 'tap';
import net from 'node:net';
import { request } from 'undici';
import { startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';
import { openTls, parseRawAnswer } from '../../fixtures/raw-tls.ts';

// llmproxy and its metrics listener close the connections an unauthenticated client could otherwise
// hold forever (core/server-limits.ts), with real sockets: a TCP connection that never starts TLS, a
// TLS connection that sends nothing, half a header, a kept-alive connection left idle, oversized
// headers, and more connections from one address (and in total) than allowed. Small bounds; the only
// time asserted is a generous "closed within".
const slow = await startHarness({
  proxy: {
    tlsHandshakeTimeout: 300,
    headersTimeout: 300,
    requestTimeout: 600,
    keepAliveTimeout: 300,
    idleTimeout: 2_000,
    metricsAddr: '127.0.0.1:0',
  },
});
t.teardown(() => slow.close());
const port = slow.proxy.port;
const ca = slow.ca.certPem;

async function metrics(h: Harness): Promise<string> {
  const res = await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher });
  return res.body.text();
}

const tcpClosedWithin = (p: number, ms: number) =>
  new Promise<boolean>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port: p });
    const timer = setTimeout(() => {
      s.destroy();
      resolve(false);
    }, ms);
    s.on('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
    s.on('error', () => {});
  });

t.test('a TCP connection that never starts TLS is closed at the handshake bound', async (t) => {
  t.ok(await tcpClosedWithin(port, 10_000), 'closed');
  t.ok(await tcpClosedWithin(slow.proxy.metricsPort!, 10_000), 'on the metrics listener too');
});

t.test('a TLS connection that sends nothing is closed', async (t) => {
  const c = await openTls(port, { ca });
  const r = await c.closed(10_000);
  t.ok(r.closed, 'closed');
  if (r.text) t.equal(parseRawAnswer(r.text).status, 408);
  const m = await openTls(slow.proxy.metricsPort!, { ca });
  t.ok((await m.closed(10_000)).closed, 'on the metrics listener too');
});

t.test('half a header, then nothing: 408 in the agent format, closed', async (t) => {
  const c = await openTls(port, { ca });
  c.socket.write('POST /v1/messages HTTP/1.1\r\nhost: x\r\n');
  const r = await c.closed(10_000);
  t.ok(r.closed, 'closed');
  const a = parseRawAnswer(r.text);
  t.equal(a.status, 408);
  t.same(JSON.parse(a.body), {
    type: 'error',
    error: { type: 'timeout_error', message: 'request not received in time' },
  });
});

t.test('a kept-alive connection left idle is closed', async (t) => {
  const c = await openTls(port, { ca });
  c.socket.write('GET /nowhere HTTP/1.1\r\nhost: x\r\n\r\n');
  const r = await c.closed(10_000);
  t.ok(r.closed, 'closed after the keep-alive bound');
  t.match(r.text, /^HTTP\/1\.1 401 /, 'after its answer (401: no credential)');
});

t.test('oversized headers: 431 in the agent format', async (t) => {
  const c = await openTls(port, { ca });
  c.socket.write(`POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-pad: ${'a'.repeat(32 * 1024)}\r\n\r\n`);
  const r = await c.closed(10_000);
  const a = parseRawAnswer(r.text);
  t.equal(a.status, 431);
  t.equal(a.headers['content-type'], 'application/json');
  t.match(JSON.parse(a.body), { type: 'error', error: { type: 'request_too_large' } });
  t.ok(r.closed);
});

t.test('a malformed request: 400 in the agent format', async (t) => {
  const c = await openTls(port, { ca });
  c.socket.write('NOT HTTP AT ALL\r\n\r\n');
  const r = await c.closed(10_000);
  const a = parseRawAnswer(r.text);
  t.equal(a.status, 400);
  t.same(JSON.parse(a.body), {
    type: 'error',
    error: { type: 'invalid_request_error', message: 'malformed HTTP request' },
  });
  t.ok(r.closed);
});

t.test('the reaped connections are counted', async (t) => {
  const text = await metrics(slow);
  for (const reason of ['handshake_timeout', 'request_timeout', 'idle', 'header_overflow', 'malformed']) {
    t.match(text, new RegExp(`dvx_connections_reaped_total\\{listener="llmproxy",reason="${reason}"\\} [1-9]`), reason);
  }
  t.match(text, /dvx_connections_reaped_total\{listener="metrics",reason="handshake_timeout"\} [1-9]/);
  t.match(text, /dvx_connections_open\{listener="llmproxy"\} 0/, 'nothing left open');
});

t.test('connections per client address and in total are bounded', async (t) => {
  const h = await startHarness({
    proxy: { maxConnectionsPerClient: 3, maxConnections: 4, metricsAddr: '127.0.0.1:0' },
  });
  t.teardown(() => h.close());
  const p = h.proxy.port;
  const held = [
    await openTls(p, { ca: h.ca.certPem }),
    await openTls(p, { ca: h.ca.certPem }),
    await openTls(p, { ca: h.ca.certPem }),
  ];
  await t.rejects(openTls(p, { ca: h.ca.certPem }), 'a fourth from the same address is closed at accept');
  const other = await openTls(p, { ca: h.ca.certPem, localAddress: '127.0.0.2' });
  t.ok(other.socket.authorized, 'another address still gets in');
  await t.rejects(
    openTls(p, { ca: h.ca.certPem, localAddress: '127.0.0.3' }),
    'past the total, anyone is closed at accept',
  );
  // The held ones still work.
  held[0].socket.write('GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
  t.match((await held[0].closed(10_000)).text, /^HTTP\/1\.1 401 /, 'a held connection is served');
  const text = await metrics(h);
  t.match(text, /dvx_connections_refused_total\{listener="llmproxy",reason="per_client"\} 1/);
  t.match(text, /dvx_connections_refused_total\{listener="llmproxy",reason="max_connections"\} 1/);
  for (const c of [...held, other]) c.socket.destroy();
});
