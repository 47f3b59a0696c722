import { once } from 'node:events';
import http from 'node:http';
import tls from 'node:tls';
import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { exchangeOn, flows } from './door-clients.ts';
import { agentCertificate, startGatewayHarness } from './gateway-harness.ts';

// An attacker's review: the identity certificate (mTLS) was checked only at the TLS handshake, so a
// kept-alive connection went on being accepted after the certificate expired. Each attempt checks it
// again: the same connection, past notAfter, gets 407 as if it had no credential, and the refusal is
// recorded under the agent the CA vouched for.

const h = await startGatewayHarness({ agentCa: true });
t.teardown(() => h.close());
const plain = http.createServer((req, res) => res.end(`plain ${req.url}`));
await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', () => resolve()));
t.teardown(() => new Promise<void>((resolve) => plain.close(() => resolve())));
const port = (plain.address() as { port: number }).port;

t.test('a kept-alive connection whose identity certificate expires is refused 407 from then on', async (t) => {
  // X.509 times are whole seconds: valid for the next two or three of them.
  const notAfter = new Date(Math.ceil(Date.now() / 1000) * 1000 + 2_000);
  const cert = await agentCertificate(h.ca, { agent: 'agent-1', org: 'org-1', group: 'g-1' }, notAfter);
  const socket = tls.connect({
    host: '127.0.0.1',
    port: h.port,
    ca: h.ca.certPem,
    servername: 'localhost',
    cert: cert.certPem,
    key: cert.keyPem,
  });
  socket.on('error', () => {});
  t.teardown(() => socket.destroy());
  await once(socket, 'secureConnect');
  const get = (path: string) =>
    exchangeOn(socket, `GET http://127.0.0.1:${port}${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`);
  const first = await get('/before');
  t.equal(first.status, 200, 'admitted while the certificate is valid');
  t.equal(first.body, 'plain /before');
  await until(() => Date.now() > notAfter.getTime() + 1_000, 10_000);
  const before = flows(h).length;
  const second = await get('/after');
  t.equal(second.status, 407, 'the same connection, the certificate expired: no credential');
  t.equal(second.headers['proxy-authenticate'], 'Bearer realm="dvx-gateway"');
  t.notOk(socket.destroyed, 'it was the kept-alive connection that was refused');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    {
      agent_id: 'agent-1',
      outcome: 'deny',
      reason: /^agent authentication failed: identity certificate expired at /,
      attrs: { status: '407' },
    },
  ]);
});
