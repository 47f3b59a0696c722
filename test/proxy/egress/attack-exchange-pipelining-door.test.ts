import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import tls from 'node:tls';
import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { startGatewayHarness } from './gateway-harness.ts';

// Pipelining on the gateway's own listener (absolute-form requests): each request is admitted (its
// token, its destination resolved and checked) only when its turn comes, so a flood pipelined behind a
// request in flight costs neither a lookup nor a held body per request; past MAX_PIPELINED waiting the
// connection is closed.

t.setTimeout(60_000);
const h = await startGatewayHarness({ resolve: { 'slow.test': ['127.0.0.1'] } });
t.teardown(() => h.close());

const held: http.ServerResponse[] = [];
const seen: string[] = [];
const dest = http.createServer((req, res) => {
  seen.push(req.url ?? '');
  req.resume();
  held.push(res);
});
dest.listen(0, '127.0.0.1');
await once(dest, 'listening');
const port = (dest.address() as AddressInfo).port;
t.teardown(() => {
  dest.closeAllConnections();
  dest.close();
});

t.test('a pipelined flood behind a request in flight: closed, not one more lookup or forward', async (t) => {
  const token = await h.token();
  const request = (path: string) =>
    `GET http://slow.test:${port}${path} HTTP/1.1\r\nHost: slow.test:${port}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`;
  const lookupsBefore = h.lookups.filter((n) => n === 'slow.test').length;
  const socket = tls.connect({ host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost' });
  socket.on('error', () => undefined);
  socket.resume();
  await once(socket, 'secureConnect');
  socket.write(request('/held'));
  t.ok(await until(() => seen.length >= 1), 'the first request reached the destination');
  let flood = '';
  for (let i = 0; i < 200; i++) flood += request(`/flood${i}`);
  socket.write(flood);
  t.ok(await until(() => socket.destroyed, 10_000), 'the gateway closed the connection');
  for (const res of held) res.end('ok');
  t.same(seen, ['/held'], 'only the first request was forwarded');
  t.equal(
    h.lookups.filter((n) => n === 'slow.test').length - lookupsBefore,
    1,
    'only the first request was admitted (its destination resolved)',
  );
});
