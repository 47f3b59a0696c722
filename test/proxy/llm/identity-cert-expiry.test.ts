import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import t from 'tap';
import { generateCa } from '../../../core/tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { exchangeOn } from '../egress/door-clients.ts';
import { agentCertificate } from '../egress/gateway-harness.ts';

// An attacker's review: llmproxy checked an agent identity certificate's validity only at the TLS
// handshake, so a kept-alive connection went on calling after it expired. Each request checks it
// again: past notAfter the same connection gets 401, as a caller with no credential does.

const dir = await mkdtemp(join(tmpdir(), 'dvx-llm-cert-expiry-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const agentCa = await generateCa('agent identity CA');
await writeFile(join(dir, 'agent-ca.pem'), agentCa.certPem);
const h = await startHarness({ proxy: { agentCa: join(dir, 'agent-ca.pem') } });
t.teardown(() => h.close());

t.test('a kept-alive connection whose identity certificate expires gets 401 from then on', async (t) => {
  const notAfter = new Date(Math.ceil(Date.now() / 1000) * 1000 + 2_000);
  const cert = await agentCertificate(agentCa, { agent: 'agent-1', org: 'org-1', group: 'g-1' }, notAfter);
  const url = new URL(h.url);
  const socket = tls.connect({
    host: url.hostname,
    port: Number(url.port),
    ca: h.ca.certPem,
    servername: 'localhost',
    cert: cert.certPem,
    key: cert.keyPem,
  });
  socket.on('error', () => {});
  t.teardown(() => socket.destroy());
  await once(socket, 'secureConnect');
  const body = JSON.stringify({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'hi' }],
  });
  const call = () =>
    exchangeOn(
      socket,
      `POST /v1/messages HTTP/1.1\r\nHost: ${url.host}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  const first = await call();
  t.equal(first.status, 200, `admitted while the certificate is valid: ${first.body}`);
  const upstreamCalls = h.upstream.received.length;
  await until(() => Date.now() > notAfter.getTime() + 1_000, 10_000);
  const second = await call();
  t.equal(second.status, 401, 'the same connection, the certificate expired: refused');
  t.match(JSON.parse(second.body), { error: { type: 'authentication_error' } });
  t.notOk(socket.destroyed, 'it was the kept-alive connection that was refused');
  t.equal(h.upstream.received.length, upstreamCalls, 'nothing reached the provider');
  t.ok(
    h.logs.some((l) => l.msg === 'agent authentication failed' && l.reason === 'expired'),
    'logged as an expired credential',
  );
});
