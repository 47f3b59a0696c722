import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { attrsOf, flowOf, startHarness } from './intercept-harness.ts';
import { exchangeRaw, openTunnel } from './intercept-tunnel.ts';

// HTTP/1.1 pipelining inside a terminated tunnel: node parses every request an agent writes at once and
// hands each to the exchange, which reads a captured body whole (up to 32 MB) before sending it. Were
// they all served at once, one connection could hold any number of 32 MB bodies (a destination that
// answers slowly keeps them all): the gateway's memory would be the agent's to fill. A connection
// carries one exchange at a time, in the order the requests came; the ones behind wait unread (their
// bodies held back by the socket's own backpressure), and a connection with more than MAX_PIPELINED
// waiting is closed.

t.setTimeout(60_000);
const h = await startHarness({ options: { upstreamTimeout: 10_000 } });
t.teardown(() => h.close());
const up = h.upstream;
const host = `dest.test:${up.port}`;

t.afterEach(() => {
  up.handle = (_req, res) => res.end('ok');
});

t.test('pipelined requests reach the destination one at a time, in order, each answered', async (t) => {
  const before = up.seen.length;
  let seenWhenFirstAnswered = -1;
  up.handle = (req, res) => {
    if (req.url !== '/p0') {
      res.end(`answer ${req.url}`);
      return;
    }
    // The first request is held until a second one reaches the destination (or a bound passes): were
    // the requests behind it forwarded at once, the destination would see them while it holds this one.
    void until(() => up.seen.length - before >= 2, 3000).then(() => {
      seenWhenFirstAnswered = up.seen.length - before;
      res.end('answer /p0');
    });
  };
  const body = 'x'.repeat(200_000);
  let raw = '';
  for (let i = 0; i < 3; i++)
    raw += `POST /p${i} HTTP/1.1\r\nHost: ${host}\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(tunnel, raw, 3);
  t.equal(seenWhenFirstAnswered, 1, 'the destination saw only the first request while it held it');
  t.same(
    up.seen.slice(before).map((s) => [s.url, s.body.length]),
    [
      ['/p0', body.length],
      ['/p1', body.length],
      ['/p2', body.length],
    ],
    'then the others, whole, in order',
  );
  const answers = [...text.matchAll(/answer (\/p\d)/g)].map((m) => m[1]);
  t.same(answers, ['/p0', '/p1', '/p2'], 'the agent got each answer, in order');
});

t.test('more pipelined requests than may wait: the connection is closed, none of them forwarded', async (t) => {
  const before = up.seen.length;
  const flowsBefore = h.flows().length;
  let release: () => void = () => undefined;
  up.handle = (_req, res) => {
    release = () => res.end('ok');
  };
  let raw = `GET /held HTTP/1.1\r\nHost: ${host}\r\n\r\n`;
  for (let i = 0; i < 200; i++) raw += `GET /flood${i} HTTP/1.1\r\nHost: ${host}\r\n\r\n`;
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  tunnel.tls!.on('data', () => undefined);
  tunnel.tls!.on('error', () => undefined);
  tunnel.tls!.write(raw);
  t.ok(await until(() => tunnel.tls!.destroyed || tunnel.raw.destroyed, 10_000), 'the gateway closed the tunnel');
  release();
  t.ok(await until(() => flowOf(h, '/held') !== undefined), 'the request in flight is recorded');
  t.same(
    up.seen.slice(before).map((s) => s.url),
    ['/held'],
    'only the first request reached the destination',
  );
  const dropped = h
    .flows()
    .slice(flowsBefore)
    .filter((r) => String(r.reason).includes('pipelined'));
  t.ok(dropped.length > 0, 'the requests that waited are recorded as dropped');
  t.equal(dropped[0]?.outcome, 'deny');
  t.match(attrsOf(dropped[0]).method, 'GET');
});
