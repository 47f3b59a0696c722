import http from 'node:http';
import tls from 'node:tls';
import t from 'tap';
import { ProxyAgent, request } from 'undici';
import {
  curl,
  parseAnswer,
  rawExchange,
  startEcho,
  startGatewayHarness,
  startHttps,
  viaGateway,
} from './gateway-harness.ts';

// The gateway's CONNECT door with real clients: curl through an https proxy (with and without a
// token), undici's ProxyAgent, and a raw TLS client for what the others hide (the 407's header, a
// half-close, bytes sent with the CONNECT). Every allowed tunnel and every refusal of a known agent is
// one network_flow record.

const h = await startGatewayHarness({ gateway: { metricsAddr: '127.0.0.1:0' } });
t.teardown(() => h.close());
const https = await startHttps(h.ca);
t.teardown(() => https.close());
const echo = await startEcho();
t.teardown(() => echo.close());
const plain = http.createServer((req, res) =>
  res.end(`plain ${req.method} ${req.url} ${req.headers.authorization} ${req.headers['proxy-authorization']}`),
);
await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', () => resolve()));
t.teardown(() => new Promise<void>((resolve) => plain.close(() => resolve())));
const plainPort = (plain.address() as { port: number }).port;

t.test('curl through a CONNECT tunnel to an https server, with a token', async (t) => {
  const before = h.audit.length;
  const r = await curl([
    ...viaGateway(h, await h.token()),
    '--cacert',
    h.caFile,
    `https://127.0.0.1:${https.port}/path?q=1`,
  ]);
  t.equal(r.code, 0, r.stderr);
  const body = JSON.parse(r.stdout);
  t.match(body, { hello: 'from https', method: 'GET', url: '/path?q=1' });
  t.equal(body.proxy_authorization, null, 'the destination never sees Proxy-Authorization');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    kind: 'network_flow',
    action: 'connect',
    actor: 'agent:agent-1',
    actor_kind: 'agent',
    agent_id: 'agent-1',
    agent_name: 'builder',
    org_id: 'org-1',
    group_id: 'g-1',
    enclave_id: 'enc-1',
    enclave_name: 'test-enclave',
    identified: true,
    proto: 'tcp',
    src_ip: '127.0.0.1',
    dst: `127.0.0.1:${https.port}`,
    dst_host: '127.0.0.1',
    dst_ip: '127.0.0.1',
    dst_port: https.port,
    outcome: 'allow',
    reason: '',
    source: 'gateway',
    attrs: { status: '200', bytes_up: /^[1-9]\d*$/, bytes_down: /^[1-9]\d*$/, duration_ms: /^\d/ },
  });
  t.match(flow.src, /^127\.0\.0\.1:\d+$/);
});

t.test('curl tunnels plain HTTP too (-p), and the agent’s own Authorization reaches the destination', async (t) => {
  const before = h.audit.length;
  const r = await curl([
    ...viaGateway(h, await h.token()),
    '-p',
    '-H',
    'Authorization: Bearer agent-own',
    `http://127.0.0.1:${plainPort}/over-connect`,
  ]);
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, 'plain GET /over-connect Bearer agent-own undefined');
  await h.flowsAfter(before);
});

t.test('curl without a token: 407 with Proxy-Authenticate, nothing reaches the destination', async (t) => {
  const accepted = https.accepted;
  const before = h.audit.length;
  const r = await curl([
    ...viaGateway(h),
    '-w',
    '%{http_connect}',
    '--cacert',
    h.caFile,
    `https://127.0.0.1:${https.port}/`,
  ]);
  t.not(r.code, 0);
  t.equal(r.stdout, '407');
  const raw = await rawExchange(h, `CONNECT 127.0.0.1:${https.port} HTTP/1.1\r\nHost: 127.0.0.1:${https.port}\r\n\r\n`);
  const a = parseAnswer(raw.text);
  t.equal(a.status, 407);
  t.equal(a.headers['proxy-authenticate'], 'Bearer realm="dvx-gateway"');
  t.equal(a.headers['content-length'], String(Buffer.byteLength(a.body)));
  t.match(JSON.parse(a.body), { type: 'error', error: { type: 'authentication_error' } });
  t.ok(raw.closed, 'the connection is closed after the answer');
  t.equal(https.accepted, accepted, 'the destination was never connected to');
  t.equal(h.audit.length, before, 'no record for a caller nothing names');
  t.ok(h.logs.some((l) => l.msg === 'agent authentication failed' && l.reason === 'agent'));
});

t.test('a bad token, another scheme, a token in Authorization: all 407', async (t) => {
  const target = `CONNECT 127.0.0.1:${https.port} HTTP/1.1\r\nHost: 127.0.0.1:${https.port}\r\n`;
  for (const header of [
    'Proxy-Authorization: Bearer not-a-jwt',
    `Proxy-Authorization: Basic ${Buffer.from('agent:pw').toString('base64')}`,
    `Authorization: Bearer ${await h.token()}`,
    `Proxy-Authorization: Bearer ${(await h.token()).slice(0, -4)}AAAA`,
  ]) {
    const a = parseAnswer((await rawExchange(h, `${target}${header}\r\n\r\n`)).text);
    t.equal(a.status, 407, header.slice(0, 30));
  }
});

t.test('an expired token signed by the issuer: 407, recorded under its agent', async (t) => {
  const before = h.audit.length;
  const old = await h.issuer.mint({}, { issuedAt: Math.floor(Date.now() / 1000) - 600, expiresIn: 300 });
  const r = await curl([
    ...viaGateway(h, old),
    '-w',
    '%{http_connect}',
    '--cacert',
    h.caFile,
    `https://127.0.0.1:${https.port}/`,
  ]);
  t.equal(r.stdout, '407');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    agent_id: 'agent-1',
    outcome: 'deny',
    reason: /agent authentication failed: token expired/,
    attrs: { status: '407' },
  });
});

t.test('undici ProxyAgent (token, proxyTls) through a tunnel to an https server', async (t) => {
  const token = await h.token();
  const agent = new ProxyAgent({
    uri: `https://localhost:${h.port}`,
    token: `Bearer ${token}`,
    proxyTls: { ca: h.ca.certPem },
    requestTls: { ca: h.ca.certPem },
  });
  for (let i = 0; i < 3; i++) {
    const res = await request(`https://localhost:${https.port}/undici/${i}`, { dispatcher: agent });
    t.equal(res.statusCode, 200);
    t.match(await res.body.json(), { hello: 'from https', url: `/undici/${i}`, proxy_authorization: null });
  }
  const refused = new ProxyAgent({
    uri: `https://localhost:${h.port}`,
    proxyTls: { ca: h.ca.certPem },
    requestTls: { ca: h.ca.certPem },
  });
  t.teardown(() => refused.close());
  await t.rejects(request(`https://localhost:${https.port}/`, { dispatcher: refused }), /407/);
  // The kept-alive tunnel's record lands once the agent closes it.
  const before = h.audit.length;
  await agent.close();
  const [flow] = await h.flowsAfter(before);
  t.match(flow, { dst: `localhost:${https.port}`, dst_host: 'localhost', outcome: 'allow' });
});

t.test('bytes sent with the CONNECT are forwarded; a half-close passes; the flow counts both ways', async (t) => {
  const before = h.audit.length;
  const token = await h.token();
  const reply = await new Promise<string>((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost' }, () => {
      // The CONNECT and the first bytes in one write: `head` for the gateway.
      s.write(
        `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: 127.0.0.1:${echo.port}\r\nProxy-Authorization: Bearer ${token}\r\n\r\nhello-`,
      );
    });
    let got = '';
    let sentRest = false;
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (!sentRest && got.includes('\r\n\r\n')) {
        sentRest = true;
        s.end('world'); // half-close: the echo still answers
      }
    });
    s.on('error', reject);
    s.on('close', () => resolve(got));
  });
  const a = parseAnswer(reply);
  t.equal(a.status, 200);
  t.match(reply, /^HTTP\/1\.1 200 Connection Established\r\n\r\n/);
  t.equal(a.body, 'hello-world', 'the head and the rest echoed, after the client had ended its side');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, { outcome: 'allow', attrs: { bytes_up: '11', bytes_down: '11' } });
});

t.test('/healthz answers in origin form; other origin-form requests are 400', async (t) => {
  const dispatcher = new (await import('undici')).Agent({ connect: { ca: h.ca.certPem } });
  t.teardown(() => dispatcher.close());
  const health = await request(`${h.proxyUrl}/healthz`, { dispatcher });
  t.equal(health.statusCode, 200);
  t.match(await health.body.json(), { component: 'gateway', status: 'ok', version: /\d/ });
  const other = await request(`${h.proxyUrl}/v1/messages`, { dispatcher });
  t.equal(other.statusCode, 400);
  t.match(await other.body.json(), {
    type: 'error',
    error: { type: 'invalid_request_error', message: /forward proxy/ },
  });
});

t.test('the metrics listener counts flows, bytes, refusals and authentication failures', async (t) => {
  const dispatcher = new (await import('undici')).Agent({ connect: { ca: h.ca.certPem } });
  t.teardown(() => dispatcher.close());
  const res = await request(`https://127.0.0.1:${h.gw.metricsPort}/metrics`, { dispatcher });
  const text = await res.body.text();
  t.match(text, /dvx_gateway_flows_total\{proto="tcp",outcome="allow"\} [1-9]/);
  t.match(text, /dvx_gateway_flows_total\{proto="tcp",outcome="deny"\} [1-9]/);
  t.match(text, /dvx_gateway_bytes_total\{direction="up"\} [1-9]/);
  t.match(text, /dvx_gateway_auth_failures_total\{reason="agent"\} [1-9]/);
  t.match(text, /dvx_gateway_refusals_total\{status="407"\} [1-9]/);
  t.match(text, /dvx_connections_open\{listener="gateway"\}/);
});
