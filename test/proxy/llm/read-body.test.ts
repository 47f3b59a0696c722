import t from 'tap';
import tls from 'node:tls';
import { post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The read-body step: the 32 MB bound, announced or not, with the prefix's room past it; and the
// listener's bounds on a request whose headers or body do not arrive in time.
const h = await startHarness();
t.teardown(() => h.close());

t.test('413 past 32 MB, announced or not', async (t) => {
  const big = Buffer.alloc(32 * 1024 * 1024 + 10, 0x61);
  const r = await post(h, '/v1/messages', big);
  t.equal(r.status, 413);
  t.match(JSON.parse(r.text), { error: { type: 'request_too_large' } });
});

t.test('a body just under 32 MB is served even though the prefix takes it past 32 MB', async (t) => {
  const body = JSON.stringify({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'x'.repeat(32 * 1024 * 1024 - 200) }],
  });
  t.ok(body.length <= 32 * 1024 * 1024);
  const r = await post(h, '/v1/messages', body);
  t.equal(r.status, 200);
  t.ok(h.upstream.received.at(-1)!.raw.length > 32 * 1024 * 1024, 'the outbound body, prefix included, passed 32 MB');
});

t.test('slow clients: headers and bodies that do not arrive in time are cut off', async (t) => {
  const slow = await startHarness({ proxy: { headersTimeout: 300, requestTimeout: 600 } });
  t.teardown(() => slow.close());
  const open = () =>
    new Promise<import('node:tls').TLSSocket>((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: slow.proxy.port, ca: slow.ca.certPem }, () => resolve(s));
      s.on('error', reject);
    });
  const answer = (s: import('node:tls').TLSSocket) =>
    new Promise<string>((resolve) => {
      let text = '';
      s.on('data', (d) => (text += d));
      s.on('close', () => resolve(text));
      s.on('error', () => resolve(text));
    });
  const started = Date.now();
  const a = await open();
  a.write('POST /v1/messages HTTP/1.1\r\nhost: x\r\n'); // headers never finish
  t.match(await answer(a), /^HTTP\/1\.1 408|^$/, 'dropped (408 or closed)');
  const b = await open();
  const token = await slow.token();
  b.write(
    `POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${token}\r\ncontent-length: 1000\r\n\r\n{"model":`,
  );
  t.match(await answer(b), /^HTTP\/1\.1 408|^$/, 'a body that stalls is dropped');
  t.ok(Date.now() - started < 10_000, 'within the configured timeouts');
});
