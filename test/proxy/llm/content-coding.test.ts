import t from 'tap';
import { gzipSync } from 'node:zlib';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { AGENT_SECRET, recordAfter, startHarness } from '../../fixtures/llmproxy-harness.ts';

// Providers gzip JSON answers when asked, and every fetch-based SDK asks. The proxy must read what it
// inspects, meters and translates: it asks the upstream for `identity`, and undoes a coding an
// upstream applies anyway. The agent always gets plain bytes.

const h = await startHarness();
t.teardown(() => h.close());
const body = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], ...extra });
const post = async (headers: Record<string, string>, payload: string | Buffer = body(), path = '/v1/messages') =>
  h.call(path, {
    headers: {
      'content-type': 'application/json',
      'x-api-key': await h.token(),
      'anthropic-version': '2023-06-01',
      ...headers,
    },
    body: payload,
  });

t.test("the agent's Accept-Encoding stays behind: the upstream is asked for identity", async (t) => {
  const records = h.audit.length;
  const res = await post({ 'accept-encoding': 'gzip, deflate, br' });
  t.equal(res.status, 200);
  t.equal(h.upstream.received.at(-1)!.headers['accept-encoding'], 'identity');
  t.notOk(res.headers['content-encoding'], 'plain bytes to the agent');
  t.equal(res.headers['content-length'], String(Buffer.byteLength(res.text)), 'a held answer goes out with its length');
  t.equal(JSON.parse(res.text).content[0].text, REPLY);
  t.match(
    await recordAfter(h, records),
    { status: 200, input_tokens: 12, output_tokens: 7 },
    'usage read from the answer',
  );
});

t.test('an upstream that gzips anyway: decoded, inspected, metered, delivered plain', async (t) => {
  const records = h.audit.length;
  const leak = `the password is ${AGENT_SECRET}`;
  const res = await post({ 'x-test-behavior': 'encode:gzip', 'x-test-reply': leak });
  t.equal(res.status, 200);
  t.notOk(res.headers['content-encoding']);
  t.equal(JSON.parse(res.text).content[0].text, leak);
  t.match(await recordAfter(h, records), {
    status: 200,
    input_tokens: 12,
    findings: [{ inspector_type: 'secrets', location: 'response_body' }],
    inspection_failopen: false,
  });
});

t.test('a compressed event stream is decoded as it arrives', async (t) => {
  const records = h.audit.length;
  const res = await post({ 'x-test-behavior': 'encode:br-stream' }, body({ stream: true }));
  t.equal(res.status, 200);
  t.notOk(res.headers['content-encoding']);
  t.match(res.text, /event: message_start/);
  t.match(res.text, /event: message_stop/);
  t.match(await recordAfter(h, records), { status: 200, output_tokens: 7 });
});

t.test('a coding we cannot read is passed on as it came and marked a fail-open', async (t) => {
  const records = h.audit.length;
  const res = await post({ 'x-test-behavior': 'encode:unknown' });
  t.equal(res.status, 200);
  t.equal(res.headers['content-encoding'], 'x-unknown');
  t.match(await recordAfter(h, records), { status: 200, inspection_failopen: true });
  t.ok(h.logs.some((l) => /content coding we cannot read/.test(String(l.msg)) && l.content_encoding === 'x-unknown'));
});

t.test('a body that is not what its coding says is a 502', async (t) => {
  const res = await post({ 'x-test-behavior': 'encode:corrupt' });
  t.equal(res.status, 502);
  t.equal(res.text, 'Upstream request failed');
});

t.test('pass-through answers are decoded too', async (t) => {
  const res = await post({ 'x-test-behavior': 'encode:gzip' }, body(), '/v1/messages/count_tokens');
  t.equal(res.status, 200);
  t.notOk(res.headers['content-encoding']);
  t.same(JSON.parse(res.text), { input_tokens: 42 });
});

t.test('raw deflate, an empty coded body, and answers that carry no body', async (t) => {
  const raw = await post({ 'x-test-behavior': 'encode:raw-deflate' });
  t.equal(raw.status, 200, 'raw deflate under "deflate", as some servers send it');
  t.equal(JSON.parse(raw.text).content[0].text, REPLY);
  const empty = await post({ 'x-test-behavior': 'encode:empty' });
  t.equal(empty.status, 200, 'an empty body under gzip is an empty body');
  t.equal(empty.text, '');
  const head = await h.call('/v1/models', {
    method: 'HEAD',
    headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01', 'x-test-behavior': 'encode:gzip' },
  });
  t.equal(head.status, 404, 'a HEAD answer is relayed, not decoded');
  t.equal(head.headers['content-encoding'], 'gzip', 'its headers as they came');
});

t.test('a compressed request body is refused: inspection reads what leaves', async (t) => {
  const before = h.upstream.received.length;
  const res = await post({ 'content-encoding': 'gzip' }, gzipSync(body()), '/v1/embeddings');
  t.equal(res.status, 415);
  t.match(JSON.parse(res.text), { error: { type: 'invalid_request_error', message: /uncompressed/ } });
  t.equal(h.upstream.received.length, before);
  t.equal((await post({ 'content-encoding': 'identity' })).status, 200, 'identity is no coding');
});

t.test('a compression bomb is cut at the held-answer limit, decoded only as fast as it is read', async (t) => {
  const res = await post({ 'x-test-behavior': 'encode:bomb' });
  t.equal(res.status, 502, '200 MB of zeros from a small gzip body: refused, not held');
  t.equal(res.text, 'Upstream request failed');
  t.ok(
    h.logs.some((l) => /exceeds/.test(String((l.err as { message?: string } | undefined)?.message))),
    'the reason is logged, with the error object',
  );
});
