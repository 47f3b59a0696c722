import t from 'tap';
import tls from 'node:tls';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The route step: provider /v1 paths in normal form only, pass-through routes after authentication,
// health, and the media types an inference route takes.
const h = await startHarness();
t.teardown(() => h.close());

t.test('pass-through routes after auth; health; unknown paths', async (t) => {
  const models = await h.call('/v1/models', {
    method: 'GET',
    headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' },
  });
  t.equal(models.status, 200);
  t.match(JSON.parse(models.text), { data: [{ id: 'claude-sonnet-4-5' }] });
  t.equal(h.upstream.received.at(-1)!.path, '/v1/models');
  t.equal((await h.call('/v1/models', { method: 'GET', headers: {} })).status, 401, 'auth first');
  const health = await h.call('/healthz', { method: 'GET', headers: {} });
  t.same(JSON.parse(health.text), { component: 'llmproxy', status: 'ok', version: '0.1.0' });
  t.equal((await h.call('/admin', { method: 'GET', headers: { 'x-api-key': await h.token() } })).status, 404);
});

t.test('dot segments never carry the platform key off the /v1 API', async (t) => {
  const before = h.upstream.received.length;
  for (const path of ['/v1/../admin', '/v1/%2e%2e/admin', '/v1/./messages/../../x', '/v1/%2E%2E/x', '/v1\\..\\x']) {
    const r = await h.call(path, {
      method: 'GET',
      headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' },
    });
    t.equal(r.status, 404, path);
  }
  t.equal(h.upstream.received.length, before, 'nothing forwarded');
});

t.test('paths not in normal form are refused, so none reaches an inference route as pass-through', async (t) => {
  const before = h.upstream.received.length;
  for (const path of [
    '/v1/messages/',
    '/v1//messages',
    '//v1/messages',
    '/v1/m%65ssages',
    '/v1/chat%2Fcompletions',
    '/v1/chat%2fcompletions',
    '/v1/x%7e',
    '/v1/',
    '/v1/res%70onses',
    '/v1/messages;x',
  ]) {
    const r = await h.call(path, {
      headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
      body: anthropicBody('hi', { model: undefined }),
    });
    t.equal(r.status, 404, path);
  }
  // A client never sends a fragment (fetch strips it); a raw request can.
  const raw = await new Promise<string>((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: h.proxy.port, ca: h.ca.certPem }, async () => {
      const body = anthropicBody('hi');
      s.write(
        `POST /v1/messages#x HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    });
    let text = '';
    s.on('data', (c) => (text += c));
    s.on('end', () => resolve(text));
    s.on('error', reject);
  });
  t.match(raw, /^HTTP\/1\.1 (404|400)/, 'a fragment in the request target');
  t.equal(h.upstream.received.length, before, 'nothing forwarded');
  const encodedReserved = await h.call('/v1/models/ft%3Aclaude%3Aorg', {
    method: 'GET',
    headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' },
  });
  t.equal(
    h.upstream.received.at(-1)!.path,
    '/v1/models/ft%3Aclaude%3Aorg',
    'percent-encoded reserved characters pass as sent',
  );
  t.equal(encodedReserved.status, 404, "the upstream's answer, relayed");
});

t.test('bad input: wrong content-type is 415, a missing model is 400', async (t) => {
  const before = h.upstream.received.length;
  const wrongType = await h.call('/v1/messages', {
    headers: { 'content-type': 'text/plain', 'x-api-key': await h.token() },
    body: anthropicBody('hi'),
  });
  t.equal(wrongType.status, 415);
  t.same(JSON.parse(wrongType.text), {
    type: 'error',
    error: { type: 'invalid_request_error', message: 'content-type must be application/json' },
  });
  const form = await h.call('/v1/chat/completions', {
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Bearer ${await h.token()}` },
    body: 'a=b',
  });
  t.equal(form.status, 415);
  t.equal(
    (
      await h.call('/v1/messages', {
        headers: { 'content-type': 'application/json; charset=utf-8', 'x-api-key': await h.token() },
        body: anthropicBody('hi'),
      })
    ).status,
    200,
    'parameters are fine',
  );
  const noModel = await post(
    h,
    '/v1/messages',
    JSON.stringify({ max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }),
  );
  t.equal(noModel.status, 400);
  t.match(JSON.parse(noModel.text), { error: { type: 'invalid_request_error', message: /model/ } });
  t.equal(
    (await post(h, '/v1/messages', JSON.stringify({ model: 42, max_tokens: 8, messages: [] }))).status,
    400,
    'a model that is not a string',
  );
  t.equal(h.upstream.received.length, before + 1, 'only the good one reached the upstream');
});
