import t from 'tap';
import { readFile, rename, writeFile } from 'node:fs/promises';
import tls from 'node:tls';
import { request } from 'undici';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { AGENT_SECRET, ORG_KEY, baseSnapshot, startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';

// The rest of the request path: every error row, bad input, credentials, flags, snapshot reloads,
// pass-through routes, streams that break, and graceful shutdown.
const h = await startHarness();
t.teardown(() => h.close());

const anthropicBody = (content: string, extra: Record<string, unknown> = {}) => JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content }], ...extra });
const post = async (harness: Harness, path: string, body: string | Buffer, headers: Record<string, string> = {}, claims: Record<string, unknown> = {}) =>
  harness.call(path, { headers: { 'content-type': 'application/json', 'x-api-key': await harness.token(claims), ...headers }, body });
const settle = () => new Promise((r) => setTimeout(r, 300));

t.test('413 past 32 MB, announced or not', async (t) => {
  const big = Buffer.alloc(32 * 1024 * 1024 + 10, 0x61);
  const r = await post(h, '/v1/messages', big);
  t.equal(r.status, 413);
  t.match(JSON.parse(r.text), { error: { type: 'request_too_large' } });
});

t.test('400 when the body is not what the format needs', async (t) => {
  for (const [path, body] of [['/v1/messages', '{"model":'], ['/v1/messages', '[1,2]'], ['/v1/messages', anthropicBody('x', { system: 42 })], ['/v1/chat/completions', '{"model":"gpt-4o"}']] as const) {
    const r = await post(h, path, body);
    t.equal(r.status, 400, `${path} ${body.slice(0, 20)}`);
    t.match(JSON.parse(r.text), { type: 'error', error: { type: 'invalid_request_error' } });
  }
});

t.test('the system prompt gets the prefix in every shape', async (t) => {
  await post(h, '/v1/messages', anthropicBody('x', { system: [{ type: 'text', text: 'mine' }] }));
  t.match(h.upstream.received.at(-1)!.body!.system, [{ type: 'text', text: /^\[dvx security context\]/ }, { type: 'text', text: 'mine' }]);
  await post(h, '/v1/messages', anthropicBody('x'));
  t.match(h.upstream.received.at(-1)!.body!.system, /^\[dvx security context\]/);
  await post(h, '/v1/responses', JSON.stringify({ model: 'gpt-4o', input: 'x' }));
  t.match(h.upstream.received.at(-1)!.body!.instructions, /^\[dvx security context\]/);
  const raw = '{"model":"claude-sonnet-4-5",  "max_tokens":8,\n "messages":[{"role":"user","content":"keep   my   spacing"}]}';
  await post(h, '/v1/messages', raw);
  const sent = h.upstream.received.at(-1)!.raw.toString();
  t.ok(sent.endsWith(raw.slice(1)), 'the rest of the body is forwarded byte for byte');
});

t.test('upstream down is 502 "Upstream request failed"; upstream errors are relayed as received', async (t) => {
  const snapshot = baseSnapshot('http://127.0.0.1:9');
  await h.writeSnapshot(snapshot);
  await settle();
  const down = await post(h, '/v1/messages', anthropicBody('hi'));
  t.equal(down.status, 502);
  t.equal(down.text, 'Upstream request failed');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  await settle();
  const rejected = await post(h, '/v1/messages', anthropicBody('hi'), { 'x-test-behavior': 'auth' });
  t.equal(rejected.status, 401);
  t.same(JSON.parse(rejected.text), { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } });
  t.match(h.audit.at(-1), { status: 401, upstream_status: 401 });
});

t.test('a stream that breaks mid-way reaches the agent as a broken stream and is audited', async (t) => {
  const res = await request(`${h.url}/v1/messages`, {
    method: 'POST', dispatcher: h.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-behavior': 'reset' },
    body: anthropicBody('hi', { stream: true }),
  });
  t.equal(res.statusCode, 200);
  const err = await res.body.text().then(() => null, (e: Error) => e);
  t.ok(err, 'the agent sees the break');
  await settle();
  t.match(h.audit.at(-1), { format: 'anthropic-messages', error: /upstream stream failed/ });
});

t.test('credentials: org key fallback, passthrough, and none', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { agents: Record<string, unknown>; orgs: Record<string, unknown> };
  snapshot.orgs['org-2'] = { config: { content_inspection: { value: {} } } };
  snapshot.agents['agent-2'] = { org_id: 'org-2', name: 'two', config: {} };
  snapshot.orgs['org-3'] = { config: { credential_mode: { value: 'passthrough' } } };
  await h.writeSnapshot(snapshot);
  await settle();
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'), {}, { sub: 'agent-2', org_id: 'org-2' })).status, 200);
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], ORG_KEY, 'the org-level key');
  const own = await h.call('/v1/chat/completions', {
    headers: { 'content-type': 'application/json', authorization: `Bearer ${await h.token({ sub: 'agent-3', org_id: 'org-3' })}`, 'x-api-key': 'sk-agents-own-key-123' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(own.status, 200);
  t.equal(h.upstream.received.at(-1)!.headers.authorization, 'Bearer sk-agents-own-key-123', 'passthrough forwards the agent\'s own key');
  const none = await post(h, '/v1/chat/completions', JSON.stringify({ model: 'gpt-4o', messages: [] }), {}, { sub: 'agent-3', org_id: 'org-3' });
  t.equal(none.status, 500);
  t.match(JSON.parse(none.text), { error: { message: 'no LLM API credential configured' } });
});

t.test('flags: inspect:llm off skips inspection, audit:llm off writes no record', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { orgs: Record<string, { flags: Record<string, boolean> }> };
  snapshot.orgs['org-1'].flags = { 'inspect:llm': false, 'audit:llm': false };
  await h.writeSnapshot(snapshot);
  await settle();
  const before = h.audit.length;
  const r = await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`));
  t.equal(r.status, 200, 'not inspected');
  await settle();
  t.equal(h.audit.length, before, 'not audited');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  await settle();
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status, 403, 'back on after the next reload');
});

t.test('a snapshot reload takes effect at once; a bad snapshot is refused whole', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { platform: Record<string, unknown> };
  snapshot.platform.model_policy = { value: { mode: 'allowlist', models: ['claude-haiku-*'] }, locked: true };
  await h.writeSnapshot(snapshot);
  await settle();
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'))).status, 403, 'the locked platform allowlist applies');
  t.match(h.audit.at(-1), { findings: [{ inspector_type: 'model_restriction', location: 'model' }] });
  await h.writeSnapshot({ ...snapshot, platform: { model_policy: { value: { mode: 'sometimes' } } } });
  await settle();
  t.ok(h.logs.some((l) => /policy snapshot reload refused/.test(String(l.msg)) && /model_policy\.value\.mode/.test(String((l.err as { message?: string } | undefined)?.message))), 'the error names the field');
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'))).status, 403, 'the last good snapshot stays');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  await settle();
});

t.test('pass-through routes after auth; health; unknown paths', async (t) => {
  const models = await h.call('/v1/models', { method: 'GET', headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' } });
  t.equal(models.status, 200);
  t.match(JSON.parse(models.text), { data: [{ id: 'claude-sonnet-4-5' }] });
  t.equal(h.upstream.received.at(-1)!.path, '/v1/models');
  t.equal((await h.call('/v1/models', { method: 'GET', headers: {} })).status, 401, 'auth first');
  const health = await h.call('/healthz', { method: 'GET', headers: {} });
  t.same(JSON.parse(health.text), { component: 'llmproxy', status: 'ok', version: '0.1.0' });
  t.equal((await h.call('/admin', { method: 'GET', headers: { 'x-api-key': await h.token() } })).status, 404);
});

t.test('fail closed: inspection that cannot finish in time is a 503', async (t) => {
  const f = await startHarness({ proxy: { inspectTimeout: 1, inspectFailClosed: true } });
  t.teardown(() => f.close());
  const big = anthropicBody('x'.repeat(4 * 1024 * 1024));
  const r = await post(f, '/v1/messages', big);
  t.equal(r.status, 503);
  t.same(JSON.parse(r.text), { type: 'error', error: { type: 'content_inspection_unavailable', message: 'Request rejected: content security inspection is unavailable.' } });
  const open = await startHarness({ proxy: { inspectTimeout: 1 } });
  t.teardown(() => open.close());
  const passed = await post(open, '/v1/messages', big);
  t.equal(passed.status, 200, 'fail open by default');
  t.match(open.audit.at(-1), { inspection_failopen: true });
  t.ok(open.logs.some((l) => l.msg === 'inspection failopen'));
});

t.test('--min-tier refuses enclaves below it', async (t) => {
  const tier = await startHarness({ proxy: { minTier: 'per-agent-tee' } });
  t.teardown(() => tier.close());
  const r = await post(tier, '/v1/messages', anthropicBody('hi'));
  t.equal(r.status, 403);
  t.match(JSON.parse(r.text), { error: { message: /isolation class/ } });
});

t.test('graceful shutdown finishes the call in flight', async (t) => {
  const g = await startHarness();
  const res = await request(`${g.url}/v1/messages`, {
    method: 'POST', dispatcher: g.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await g.token() },
    body: anthropicBody('hi', { stream: true }),
  });
  const closing = g.close();
  const text = await res.body.text();
  t.match(text, /message_stop/, 'the stream ran to its end');
  t.ok(text.includes(REPLY.split(' ')[0]));
  await closing;
});

t.test('response inspection is observe-only: a leak in the answer is recorded, the answer delivered', async (t) => {
  const leak = `the password is ${AGENT_SECRET} ok`;
  const plain = await post(h, '/v1/messages', anthropicBody('hi'), { 'x-test-reply': leak });
  t.equal(plain.status, 200);
  t.match(JSON.parse(plain.text).content[0].text, leak);
  t.match(h.audit.at(-1), { status: 200, findings: [{ inspector_type: 'secrets', severity: 'block', location: 'response_body', match: 'hunt****' }] });
  const streamed = await post(h, '/v1/messages', anthropicBody('hi', { stream: true }), { 'x-test-reply': leak });
  t.equal(streamed.status, 200);
  t.match(streamed.text, /message_stop/);
  await settle();
  t.match(h.audit.at(-1), { findings: [{ inspector_type: 'secrets', location: 'response_body' }] }, 'found across stream deltas');
});

t.test('the secrets filter follows a rewritten secrets file', async (t) => {
  const path = `${h.dir}/secrets.json`;
  const original = await readFile(path, 'utf8');
  const rotated = 'rotated-secret-value-0042';
  await writeFile(`${path}.tmp`, JSON.stringify({ ...JSON.parse(original), 'agent:agent-1': { ...JSON.parse(original)['agent:agent-1'], db_password: rotated } }));
  await rename(`${path}.tmp`, path);
  await settle();
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${rotated}`))).status, 403, 'the new value is a needle');
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status, 200, 'the old one is not any more');
  await writeFile(`${path}.tmp`, original);
  await rename(`${path}.tmp`, path);
  await settle();
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status, 403, 'and back');
});

t.test('metrics on their own TLS listener', async (t) => {
  const m = await startHarness({ proxy: { metricsAddr: '127.0.0.1:0' } });
  t.teardown(() => m.close());
  await post(m, '/v1/messages', anthropicBody('hi'));
  await post(m, '/v1/messages', anthropicBody('key AKIAIOSFODNN7EXAMPLE'));
  const res = await request(`https://127.0.0.1:${m.proxy.metricsPort}/metrics`, { dispatcher: m.dispatcher });
  const text = await res.body.text();
  t.match(text, /dvx_llmproxy_requests_total\{format="anthropic-messages",status="200"\} 1/);
  t.match(text, /dvx_llmproxy_requests_total\{format="anthropic-messages",status="403"\} 1/);
  t.match(text, /dvx_llmproxy_overhead_seconds_count\{format="anthropic-messages"\} 2/);
  t.match(text, /dvx_llmproxy_upstream_seconds_count\{format="anthropic-messages"\} 1/);
  t.match(text, /dvx_inspection_findings_total\{inspector_type="api_key",severity="block"\} 1/);
});

t.test('a body just under 32 MB is served even though the prefix takes it past 32 MB', async (t) => {
  const body = JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'x'.repeat(32 * 1024 * 1024 - 200) }] });
  t.ok(body.length <= 32 * 1024 * 1024);
  const r = await post(h, '/v1/messages', body);
  t.equal(r.status, 200);
  t.ok(h.upstream.received.at(-1)!.raw.length > 32 * 1024 * 1024, 'the outbound body, prefix included, passed 32 MB');
});

t.test('slow clients: headers and bodies that do not arrive in time are cut off', async (t) => {
  const slow = await startHarness({ proxy: { headersTimeout: 300, requestTimeout: 600 } });
  t.teardown(() => slow.close());
  const open = () => new Promise<import('node:tls').TLSSocket>((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: slow.proxy.port, ca: slow.ca.certPem }, () => resolve(s));
    s.on('error', reject);
  });
  const answer = (s: import('node:tls').TLSSocket) => new Promise<string>((resolve) => {
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
  b.write(`POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${token}\r\ncontent-length: 1000\r\n\r\n{"model":`);
  t.match(await answer(b), /^HTTP\/1\.1 408|^$/, 'a body that stalls is dropped');
  t.ok(Date.now() - started < 10_000, 'within the configured timeouts');
});

t.test('bad input: wrong content-type is 415, a missing model is 400', async (t) => {
  const before = h.upstream.received.length;
  const wrongType = await h.call('/v1/messages', { headers: { 'content-type': 'text/plain', 'x-api-key': await h.token() }, body: anthropicBody('hi') });
  t.equal(wrongType.status, 415);
  t.same(JSON.parse(wrongType.text), { type: 'error', error: { type: 'invalid_request_error', message: 'content-type must be application/json' } });
  const form = await h.call('/v1/chat/completions', { headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Bearer ${await h.token()}` }, body: 'a=b' });
  t.equal(form.status, 415);
  t.equal((await h.call('/v1/messages', { headers: { 'content-type': 'application/json; charset=utf-8', 'x-api-key': await h.token() }, body: anthropicBody('hi') })).status, 200, 'parameters are fine');
  const noModel = await post(h, '/v1/messages', JSON.stringify({ max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }));
  t.equal(noModel.status, 400);
  t.match(JSON.parse(noModel.text), { error: { type: 'invalid_request_error', message: /model/ } });
  t.equal((await post(h, '/v1/messages', JSON.stringify({ model: 42, max_tokens: 8, messages: [] }))).status, 400, 'a model that is not a string');
  t.equal(h.upstream.received.length, before + 1, 'only the good one reached the upstream');
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
      res.end(JSON.stringify({ id: 'm', type: 'message', role: 'assistant', model: 'x', content: [{ type: 'text', text: 'over tls' }], stop_reason: 'end_turn', usage: { input_tokens: 1, output_tokens: 1 } }));
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
  t.equal((await post(untrusted, '/v1/messages', anthropicBody('hi'))).status, 502, 'without --upstream-ca the upstream is not trusted');
});

t.test('a large body gets the prefix spliced in place, every other byte as sent', async (t) => {
  const big = 'y'.repeat(300 * 1024);
  for (const [label, raw] of [
    ['system string', `{"model":"claude-sonnet-4-5","max_tokens":8,"system":"mine","messages":[{"role":"user","content":"${big}"}]}`],
    ['no system', `{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"${big}"}]}`],
    ['system blocks', `{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"mine"}],"max_tokens":8,"messages":[{"role":"user","content":"${big}"}]}`],
  ] as const) {
    t.equal((await post(h, '/v1/messages', raw)).status, 200, label);
    const sent = h.upstream.received.at(-1)!;
    const parsed = sent.body as { system: unknown; messages: { content: string }[] };
    t.equal(parsed.messages[0].content, big, `${label}: content intact`);
    t.match(JSON.stringify(parsed.system), /\[dvx security context\]/, `${label}: prefix present`);
    const prefixEnd = sent.raw.indexOf('"messages"');
    t.ok(sent.raw.subarray(prefixEnd).equals(Buffer.from(raw.slice(raw.indexOf('"messages"')))), `${label}: the tail is byte for byte`);
  }
});

t.test('dot segments never carry the platform key off the /v1 API', async (t) => {
  const before = h.upstream.received.length;
  for (const path of ['/v1/../admin', '/v1/%2e%2e/admin', '/v1/./messages/../../x', '/v1/%2E%2E/x', '/v1\\..\\x']) {
    const r = await h.call(path, { method: 'GET', headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' } });
    t.equal(r.status, 404, path);
  }
  t.equal(h.upstream.received.length, before, 'nothing forwarded');
});

t.test('paths not in normal form are refused, so none reaches an inference route as pass-through', async (t) => {
  const before = h.upstream.received.length;
  for (const path of ['/v1/messages/', '/v1//messages', '//v1/messages', '/v1/m%65ssages', '/v1/chat%2Fcompletions', '/v1/chat%2fcompletions', '/v1/x%7e', '/v1/', '/v1/res%70onses', '/v1/messages;x']) {
    const r = await h.call(path, { headers: { 'content-type': 'application/json', 'x-api-key': await h.token() }, body: anthropicBody('hi', { model: undefined }) });
    t.equal(r.status, 404, path);
  }
  // A client never sends a fragment (fetch strips it); a raw request can.
  const raw = await new Promise<string>((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: h.proxy.port, ca: h.ca.certPem }, async () => {
      const body = anthropicBody('hi');
      s.write(`POST /v1/messages#x HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
    });
    let text = '';
    s.on('data', (c) => (text += c));
    s.on('end', () => resolve(text));
    s.on('error', reject);
  });
  t.match(raw, /^HTTP\/1\.1 (404|400)/, 'a fragment in the request target');
  t.equal(h.upstream.received.length, before, 'nothing forwarded');
  const encodedReserved = await h.call('/v1/models/ft%3Aclaude%3Aorg', { method: 'GET', headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' } });
  t.equal(h.upstream.received.at(-1)!.path, '/v1/models/ft%3Aclaude%3Aorg', 'percent-encoded reserved characters pass as sent');
  t.equal(encodedReserved.status, 404, 'the upstream\'s answer, relayed');
});
