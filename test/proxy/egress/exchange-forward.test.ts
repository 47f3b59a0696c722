import t from 'tap';
import { once } from 'node:events';
import net, { type AddressInfo } from 'node:net';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { AGENT_SECRET, attrsOf, flowOf, startHarness } from './intercept-harness.ts';
import { exchangeRaw, openTunnel } from './intercept-tunnel.ts';

// Forwarding one request: smuggling shapes refused, hop-by-hop headers dropped both ways, the pinned
// address used, plain-http absolute-form requests, a destination that never answers (504) or cannot
// be reached (502), answers streamed as they come, an agent that stops reading or leaves.

t.setTimeout(90_000);
const h = await startHarness({ options: { upstreamTimeout: 2000 } });
t.teardown(() => h.close());
const up = h.upstream;
const host = `dest.test:${up.port}`;

t.afterEach(() => {
  up.handle = (_req, res) => res.end('ok');
});

t.test('smuggling shapes are refused (400), the destination sees none of them', async (t) => {
  const before = up.seen.length;
  const shapes: [string, string][] = [
    [
      'TE with CL',
      `POST /s HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n`,
    ],
    ['CL twice', `POST /s HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello`],
    [
      'CL twice, differing',
      `POST /s HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!`,
    ],
    ['Host twice', `GET /s HTTP/1.1\r\nHost: ${host}\r\nHost: evil.test\r\n\r\n`],
    ['CR inside a value', `GET /s HTTP/1.1\r\nHost: ${host}\r\nX-A: b\rc\r\n\r\n`],
    ['LF inside a value', `GET /s HTTP/1.1\r\nHost: ${host}\r\nX-A: b\nX-B: c\r\n\r\n`],
    ['obs-fold', `GET /s HTTP/1.1\r\nHost: ${host}\r\nX-A: b\r\n c\r\n\r\n`],
    ['TE not chunked', `POST /s HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n`],
    ['space before colon', `GET /s HTTP/1.1\r\nHost: ${host}\r\nContent-Length : 0\r\n\r\n`],
  ];
  for (const [what, raw] of shapes) {
    const tunnel = await openTunnel(h, 'dest.test', up.port);
    const answer = parseRawAnswer(await exchangeRaw(tunnel, raw));
    t.equal(answer.status, 400, what);
  }
  t.equal(up.seen.length, before, 'nothing reached the destination');
});

t.test('hop-by-hop headers and the agent x-dvx-* go no further, either way; the rest is relayed', async (t) => {
  up.handle = (_req, res) => {
    res.writeHead(200, {
      connection: 'X-Resp-Drop',
      'x-resp-drop': '1',
      'keep-alive': 'timeout=5',
      'alt-svc': 'h3=":443"',
      'proxy-authenticate': 'Basic realm="x"',
      'x-resp-kept': 'yes',
      'content-length': '2',
    });
    res.end('ok');
  };
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(
    tunnel,
    `GET /hop HTTP/1.1\r\nHost: ${host}\r\nConnection: keep-alive, X-Drop-Me\r\nX-Drop-Me: 1\r\n` +
      'Keep-Alive: timeout=5\r\nProxy-Authorization: Bearer gateway-only\r\nProxy-Connection: keep-alive\r\n' +
      'TE: trailers\r\nTrailer: X-T\r\nUpgrade: websocket\r\nX-Dvx-Gateway-Identity: forged\r\nX-Dvx-Other: 1\r\n' +
      'X-Kept: yes\r\n\r\n',
  );
  const answer = parseRawAnswer(text);
  t.equal(answer.status, 200);
  const seen = up.seen.at(-1)!;
  t.equal(seen.url, '/hop');
  t.equal(seen.headers['x-kept'], 'yes');
  for (const name of [
    'x-drop-me',
    'keep-alive',
    'proxy-authorization',
    'proxy-connection',
    'te',
    'trailer',
    'upgrade',
    'x-dvx-gateway-identity',
    'x-dvx-other',
  ])
    t.notOk(name in seen.headers, `${name} not forwarded`);
  t.equal(answer.headers['x-resp-kept'], 'yes');
  for (const name of ['x-resp-drop', 'alt-svc', 'proxy-authenticate'])
    t.notOk(name in answer.headers, `${name} not relayed`);
  t.not(
    answer.headers['keep-alive'],
    'timeout=5',
    "the destination's keep-alive is not relayed (the gateway's own hop has its own)",
  );
});

t.test('the connection goes to the address pinned at the CONNECT: the name is not resolved again', async (t) => {
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  h.names.set('dest.test', '192.0.2.1'); // what a rebinding answer would say now
  t.teardown(() => h.names.set('dest.test', '127.0.0.1'));
  const answer = parseRawAnswer(await exchangeRaw(tunnel, `GET /pinned HTTP/1.1\r\nHost: ${host}\r\n\r\n`));
  t.equal(answer.status, 200);
  t.equal(up.seen.at(-1)?.url, '/pinned');
  t.ok(await until(() => flowOf(h, '/pinned') !== undefined));
  t.equal(flowOf(h, '/pinned')?.dst_ip, '127.0.0.1');
});

t.test('absolute-form plain http: forwarded to a node:http destination, captured and inspected', async (t) => {
  const url = `http://plain.test:${h.plain.port}/plain?x=1`;
  const answer = await request(url, { dispatcher: h.proxy({ tunnel: false }) });
  t.equal(answer.statusCode, 200);
  t.equal(await answer.body.text(), 'ok');
  t.equal(h.plain.seen.at(-1)?.url, '/plain?x=1');
  t.equal(h.plain.seen.at(-1)?.headers.host, `plain.test:${h.plain.port}`);
  t.ok(await until(() => flowOf(h, '/plain?x=1') !== undefined));
  t.match(flowOf(h, '/plain?x=1'), {
    proto: 'http',
    dst_ip: '127.0.0.1',
    attrs: { url, method: 'GET', status: '200', response_body: 'ok' },
  });
  const before = h.plain.seen.length;
  const blocked = await request(`http://plain.test:${h.plain.port}/plain-secret`, {
    dispatcher: h.proxy({ tunnel: false }),
    method: 'POST',
    body: `pw=${AGENT_SECRET}`,
  });
  t.equal(blocked.statusCode, 403);
  await blocked.body.text();
  t.equal(h.plain.seen.length, before, 'blocked before it was sent');
});

t.test('a destination that never answers is cut at --upstream-timeout (504)', async (t) => {
  up.handle = () => {};
  const answer = await request(`https://${host}/silent`, { dispatcher: h.proxy() });
  t.equal(answer.statusCode, 504);
  t.match(await answer.body.json(), { error: { type: 'timeout_error' } });
  t.ok(await until(() => flowOf(h, '/silent') !== undefined));
  t.match(flowOf(h, '/silent'), {
    outcome: 'allow',
    reason: /no response headers within 2000 ms/,
    attrs: { status: '504' },
  });
});

t.test('a destination that cannot be reached: 502 Upstream request failed', async (t) => {
  const probe = net.createServer().listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const answer = await request(`https://dest.test:${port}/nobody`, { dispatcher: h.proxy() });
  t.equal(answer.statusCode, 502);
  t.equal(await answer.body.text(), 'Upstream request failed');
  t.ok(await until(() => flowOf(h, '/nobody') !== undefined));
  t.match(flowOf(h, '/nobody'), { reason: /ECONNREFUSED/ });
});

t.test('a large answer is streamed as it comes, never held whole', async (t) => {
  const first = Buffer.alloc(64 * 1024, 'a');
  const rest = Buffer.alloc(2 * 1024 * 1024, 'b');
  let agentHasFirst!: () => void;
  const firstArrived = new Promise<void>((r) => (agentHasFirst = r));
  up.handle = (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    res.write(first);
    // The rest is sent only once the agent has bytes of the answer: a gateway holding the answer
    // until its end would wait for ever here (bounded by the test's timeout).
    void firstArrived.then(() => res.end(rest));
  };
  const answer = await request(`https://${host}/large`, { dispatcher: h.proxy() });
  let received = 0;
  for await (const chunk of answer.body) {
    if (received === 0) agentHasFirst();
    received += (chunk as Buffer).length;
  }
  t.equal(received, first.length + rest.length);
  t.ok(await until(() => flowOf(h, '/large') !== undefined));
  const rec = flowOf(h, '/large')!;
  t.equal(attrsOf(rec).response_body_bytes, String(first.length + rest.length));
  t.equal(attrsOf(rec).response_truncated, 'true');
});

t.test('an agent that leaves mid-answer: the destination call is dropped, the record says so', async (t) => {
  let upstreamClosed!: () => void;
  const closed = new Promise<void>((r) => (upstreamClosed = r));
  up.handle = (_req, res) => {
    res.on('close', () => upstreamClosed());
    res.write('first part');
  };
  const answer = await request(`https://${host}/leaving`, { dispatcher: h.proxy() });
  for await (const _chunk of answer.body) break;
  await closed;
  t.pass('the destination saw its answer dropped');
  t.ok(await until(() => flowOf(h, '/leaving') !== undefined));
  t.match(flowOf(h, '/leaving'), { reason: /agent closed the connection/ });
});

t.test('an agent that stops reading is cut after --idle-timeout, releasing the destination', async (t) => {
  const slow = await startHarness({ options: { idleTimeout: 500 } });
  t.teardown(() => slow.close());
  const chunk = Buffer.alloc(64 * 1024, 'z');
  let upstreamClosed!: () => void;
  const closed = new Promise<void>((r) => (upstreamClosed = r));
  slow.upstream.handle = (_req, res) => {
    res.on('close', () => upstreamClosed());
    const pump = () => {
      while (!res.destroyed && res.write(chunk));
    };
    res.on('drain', pump);
    pump();
  };
  const tunnel = await openTunnel(slow, 'dest.test', slow.upstream.port);
  tunnel.tls!.write(`GET /stalled HTTP/1.1\r\nHost: dest.test:${slow.upstream.port}\r\n\r\n`);
  tunnel.raw.pause(); // takes nothing more: the gateway's writes to it back up
  await closed;
  t.pass('the destination call was released');
  t.ok(await until(() => flowOf(slow, '/stalled') !== undefined));
  t.match(flowOf(slow, '/stalled'), { reason: /stopped reading/ });
  tunnel.raw.destroy();
});
