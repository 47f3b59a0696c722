import t from 'tap';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { attrsOf, flowOf, startHarness } from './intercept-harness.ts';
import { exchangeRaw, lastPort, openTunnel, tunnelFlow } from './intercept-tunnel.ts';

// Terminating a tunnel's TLS: the leaf of the CONNECT host (cached), the SNI and Host checks, ALPN,
// the bytes that came with the CONNECT, the time bounds, and the tunnel's own flow.

t.setTimeout(90_000);
const h = await startHarness({
  options: { tlsHandshakeTimeout: 400, headersTimeout: 600, requestTimeout: 1200 },
});
t.teardown(() => h.close());
const up = h.upstream;
const dest = `https://dest.test:${up.port}`;

t.test(
  'a request through a CONNECT (undici ProxyAgent) reaches the destination over a leaf for its name',
  async (t) => {
    const answer = await request(`${dest}/hello?x=1`, { dispatcher: h.proxy() });
    t.equal(answer.statusCode, 200);
    t.equal(await answer.body.text(), 'ok');
    const seen = up.seen.at(-1)!;
    t.equal(seen.url, '/hello?x=1');
    t.equal(seen.servername, 'dest.test', 'the gateway names the host to the destination (SNI)');
    t.equal(seen.headers.host, `dest.test:${up.port}`);
    t.ok(await until(() => flowOf(h, '/hello') !== undefined), 'the request has its network_flow record');
    const rec = flowOf(h, '/hello')!;
    t.match(rec, {
      proto: 'https',
      action: 'http.request',
      outcome: 'allow',
      dst_host: 'dest.test',
      agent_id: 'agent-1',
    });
    t.equal(attrsOf(rec).url, `https://dest.test:${up.port}/hello?x=1`);
  },
);

t.test('curl through the door with the interception CA', async (t) => {
  const { stdout } = await promisify(execFile)(
    'curl',
    [
      '-sS',
      '--max-time',
      '10',
      '--proxy',
      h.doorUrl,
      '--cacert',
      h.gatewayCaPath,
      `${dest}/curl`,
      '-w',
      '\n%{http_code}',
    ],
    { timeout: 15_000 },
  );
  t.equal(stdout, 'ok\n200');
  t.equal(up.seen.at(-1)?.url, '/curl');
});

t.test('the leaf: DNS SAN of the CONNECT host, minted once for many tunnels; no SNI gets the same leaf', async (t) => {
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const cert = tunnel.tls!.getPeerX509Certificate()!;
  t.equal(cert.subjectAltName, 'DNS:dest.test');
  t.equal(tunnel.tls!.alpnProtocol, false, 'no ALPN asked, none chosen');
  tunnel.tls!.destroy();
  const interceptor = h.deps.interceptor as unknown as { leavesMinted: number };
  const before = interceptor.leavesMinted;
  for (let i = 0; i < 3; i++) (await openTunnel(h, 'dest.test', up.port)).tls!.destroy();
  t.equal(interceptor.leavesMinted, before, 'cached: no new mint');
  const bare = await openTunnel(h, 'dest.test', up.port, { servername: '' });
  t.equal(bare.tls!.getPeerX509Certificate()!.subjectAltName, 'DNS:dest.test', 'no SNI: the CONNECT host');
  bare.tls!.destroy();
  const other = await openTunnel(h, 'other.test', up.port);
  t.equal(other.tls!.getPeerX509Certificate()!.subjectAltName, 'DNS:other.test', 'another host: its own leaf');
  other.tls!.destroy();
  t.equal(interceptor.leavesMinted, before + 1);
});

t.test('the ClientHello sent with the CONNECT (the head) is read by the TLS layer', async (t) => {
  const before = h.heads.length;
  const tunnel = await openTunnel(h, 'dest.test', up.port, { alpn: ['h2', 'http/1.1'] });
  t.ok(h.heads[before] > 0, 'the door got bytes after the CONNECT');
  t.equal(tunnel.tls!.alpnProtocol, 'http/1.1', 'ALPN: http/1.1 only');
  const text = await exchangeRaw(
    tunnel,
    `GET /head HTTP/1.1\r\nHost: dest.test:${up.port}\r\nConnection: close\r\n\r\n`,
  );
  t.equal(parseRawAnswer(text).status, 200);
  t.equal(parseRawAnswer(text).body, 'ok');
});

t.test('an SNI naming another host than the CONNECT is refused at the handshake', async (t) => {
  const seen = up.seen.length;
  const refused = await openTunnel(h, 'dest.test', up.port, { servername: 'other.test' }).catch((e: Error) => e);
  t.type(refused, Error, 'no handshake');
  const port = lastPort;
  t.ok(await until(() => tunnelFlow(h, port) !== undefined), 'serve() resolved once the client was gone');
  t.match(tunnelFlow(h, port)!.attrs, { intercepted: 'true', tls_error: /other\.test is not the CONNECT host/ });
  t.equal(up.seen.length, seen, 'nothing reached the destination');
});

t.test('a client offering only h2 gets no handshake (ALPN http/1.1 only)', async (t) => {
  const refused = await openTunnel(h, 'dest.test', up.port, { alpn: ['h2'] }).catch((e: Error) => e);
  t.match(refused, { message: /no application protocol/ });
});

t.test('a Host that is not the CONNECT host is answered 421, nothing sent', async (t) => {
  const seen = up.seen.length;
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(tunnel, `GET /misdirected HTTP/1.1\r\nHost: other.test:${up.port}\r\n\r\n`);
  const answer = parseRawAnswer(text);
  t.equal(answer.status, 421);
  t.match(JSON.parse(answer.body), { type: 'error', error: { type: 'invalid_request_error' } });
  const tunnel2 = await openTunnel(h, 'dest.test', up.port);
  const absolute = parseRawAnswer(
    await exchangeRaw(tunnel2, `GET https://other.test:${up.port}/abs HTTP/1.1\r\nHost: dest.test:${up.port}\r\n\r\n`),
  );
  t.equal(absolute.status, 421, 'an absolute-form target naming another host too');
  const wrongPort = await openTunnel(h, 'dest.test', up.port);
  const port = parseRawAnswer(await exchangeRaw(wrongPort, `GET /port HTTP/1.1\r\nHost: dest.test:1\r\n\r\n`));
  t.equal(port.status, 421, 'a Host naming another port');
  t.equal(up.seen.length, seen, 'nothing reached the destination');
  t.ok(await until(() => h.flows().some((r) => r.outcome === 'deny' && /Host other\.test/.test(String(r.reason)))));
});

t.test('a client that never starts its handshake is cut at --tls-handshake-timeout', async (t) => {
  const tunnel = await openTunnel(h, 'dest.test', up.port, { noTls: true });
  await tunnel.closed;
  t.ok(await until(() => tunnelFlow(h, tunnel) !== undefined));
  t.match(tunnelFlow(h, tunnel)!.attrs, { tls_error: /handshake not completed within 400 ms/ });
});

t.test('inside the tunnel: headers that never complete are answered 408 and the connection closed', async (t) => {
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(tunnel, 'GET / HTTP/1.1\r\nHost: dest');
  t.equal(parseRawAnswer(text).status, 408);
  await tunnel.closed;
});

t.test("the tunnel's flow: intercepted, its requests counted, their bytes summed once it closed", async (t) => {
  up.handle = (_req, res) => res.end('0123456789');
  t.teardown(() => {
    up.handle = (_req, res) => res.end('ok');
  });
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(
    tunnel,
    `POST /a HTTP/1.1\r\nHost: dest.test:${up.port}\r\nContent-Length: 5\r\n\r\nhello` +
      `GET /b HTTP/1.1\r\nHost: dest.test:${up.port}\r\nConnection: close\r\n\r\n`,
    2,
  );
  t.equal(text.match(/HTTP\/1\.1 200/g)?.length, 2, 'two answers in one tunnel');
  t.ok(await until(() => tunnelFlow(h, tunnel) !== undefined));
  const flow = tunnelFlow(h, tunnel)!;
  t.match(flow, { proto: 'tcp', bytesUp: 5, bytesDown: 20, attrs: { intercepted: 'true', requests: '2' } });
});

t.test('TLS inside TLS: the door itself over https (as the gateway is)', async (t) => {
  const tlsHarness = await startHarness({ tlsDoor: true });
  t.teardown(() => tlsHarness.close());
  const answer = await request(`https://dest.test:${tlsHarness.upstream.port}/tls-in-tls`, {
    dispatcher: tlsHarness.proxy(),
  });
  t.equal(answer.statusCode, 200);
  t.equal(await answer.body.text(), 'ok');
  t.equal(tlsHarness.upstream.seen.at(-1)?.url, '/tls-in-tls');
});
