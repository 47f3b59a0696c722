import t from 'tap';
import { anthropicBody, baseSnapshot, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The forward step: an upstream that is down, one that refuses, and one behind a private CA.
const h = await startHarness();
t.teardown(() => h.close());

t.test('upstream down is 502 "Upstream request failed"; upstream errors are relayed as received', async (t) => {
  const snapshot = baseSnapshot('http://127.0.0.1:9');
  await h.writeSnapshot(snapshot);
  const down = await post(h, '/v1/messages', anthropicBody('hi'));
  t.equal(down.status, 502);
  t.equal(down.text, 'Upstream request failed');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  const rejected = await post(h, '/v1/messages', anthropicBody('hi'), { 'x-test-behavior': 'auth' });
  t.equal(rejected.status, 401);
  t.same(JSON.parse(rejected.text), {
    type: 'error',
    error: { type: 'authentication_error', message: 'invalid x-api-key' },
  });
  t.match(h.audit.at(-1), { status: 401, upstream_status: 401 });
});

t.test('--upstream-ca: an HTTPS upstream signed by a private CA is trusted only with it', async (t) => {
  const { generateCa, issueCertificate } = await import('../../../core/tls.ts');
  const https = await import('node:https');
  const { writeFile } = await import('node:fs/promises');
  const { join } = await import('node:path');
  const ca = await generateCa('upstream CA');
  const leaf = await issueCertificate(ca, { commonName: '127.0.0.1', ipAddresses: ['127.0.0.1'] });
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id: 'm',
          type: 'message',
          role: 'assistant',
          model: 'x',
          content: [{ type: 'text', text: 'over tls' }],
          stop_reason: 'end_turn',
          usage: { input_tokens: 1, output_tokens: 1 },
        }),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const upstreamUrl = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  const caFile = join(h.dir, 'upstream-ca.pem');
  await writeFile(caFile, ca.certPem);
  const trusted = await startHarness({ snapshot: () => baseSnapshot(upstreamUrl), proxy: { upstreamCa: caFile } });
  t.teardown(() => trusted.close());
  const ok = await post(trusted, '/v1/messages', anthropicBody('hi'));
  t.equal(ok.status, 200);
  t.match(ok.text, /over tls/);
  const untrusted = await startHarness({ snapshot: () => baseSnapshot(upstreamUrl) });
  t.teardown(() => untrusted.close());
  t.equal(
    (await post(untrusted, '/v1/messages', anthropicBody('hi'))).status,
    502,
    'without --upstream-ca the upstream is not trusted',
  );
});
