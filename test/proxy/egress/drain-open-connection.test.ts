import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import tls from 'node:tls';
import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { startGatewayHarness } from './gateway-harness.ts';

// A rolling restart (cli/serve-workers.ts) drains a gateway worker while its agents' connections are
// still open. An agent whose request was under way when the drain began sends its next absolute-form
// request on the same keep-alive connection: it is served, with `connection: close` (its client opens
// the next connection elsewhere, on a live worker), not refused with a 503. A destination that holds its
// answers keeps requests in flight.

const holds = new Map<string, () => void>();
const destination = http.createServer((req, res) => {
  const answer = () => res.end(`answer to ${req.url}`);
  if (req.url?.startsWith('/hold-')) holds.set(req.url, answer);
  else answer();
});
destination.listen(0, '127.0.0.1');
await once(destination, 'listening');
t.teardown(() => {
  destination.closeAllConnections();
  destination.close();
});
const port = (destination.address() as AddressInfo).port;

const h = await startGatewayHarness({ gateway: { allowDest: [`cidr=127.0.0.1/32,port=${port}`] } });
t.teardown(() => h.close());

/** A raw TLS connection to the gateway, collecting what comes back. */
async function agentConnection() {
  const socket = tls.connect({ host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost' });
  socket.on('error', () => {});
  await once(socket, 'secureConnect');
  let got = '';
  socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  return {
    socket,
    closed,
    got: () => got,
    answers: () => [...got.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => m[1]),
  };
}

t.test(
  'an absolute-form request on an open connection during the drain is served, and its connection closed',
  async (t) => {
    const token = await h.token();
    const get = (path: string) =>
      `GET http://127.0.0.1:${port}${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`;
    const a = await agentConnection();
    const b = await agentConnection();
    a.socket.write(get('/hold-a'));
    b.socket.write(get('/hold-b'));
    t.ok(await until(() => holds.has('/hold-a') && holds.has('/hold-b')), 'two requests in flight');

    const closing = h.gw.close();
    holds.get('/hold-b')!();
    t.ok(await until(() => b.answers().length === 1), 'the request begun before the drain was answered');
    t.match(b.got(), /connection: keep-alive/i, 'and its connection was kept');

    b.socket.write(get('/next'));
    t.ok(await until(() => b.answers().length === 2), 'the next request on the same connection was answered');
    await b.closed;
    t.same(b.answers(), ['200', '200'], 'served during the drain, not refused');
    const last = b.got().slice(b.got().lastIndexOf('HTTP/1.1 '));
    t.match(last, /connection: close/i, 'its connection closed after it');
    t.match(last, /answer to \/next$/, 'with the destination’s answer');

    holds.get('/hold-a')!();
    t.ok(await until(() => a.answers().length === 1), 'the other request in flight finished');
    t.same(a.answers(), ['200']);
    await closing;
    const served = h.audit.filter(
      (r) => r.table === 'network_flow' && String((r.attrs as { url?: string })?.url).endsWith('/next'),
    );
    t.equal(served.length, 1, 'the request served during the drain has its record');
    t.match(served[0], { outcome: 'allow', attrs: { status: '200' } });
  },
);
