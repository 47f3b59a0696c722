import t from 'tap';
import { baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// Under a tool-call policy, the routes other than the inference routes: only those whose answers never
// carry model output go through (models, token counts, embeddings, moderations). A stored response or
// completion, batch results or a conversation's items would replay a model's tool calls undecided, so
// they are refused before the upstream is asked, and the refusal is recorded. Without a tool rule every
// route passes as before.

const withPolicy = (url: string) => {
  const s = baseSnapshot(url) as { orgs: Record<string, { config: Record<string, unknown> }> };
  s.orgs['org-1'].config.llm_policy = {
    value: { inspection: { inspectors: [{ name: 'ops', rules: [{ tool: 'delete_*', verdict: 'deny' }] }] } },
  };
  return s;
};

const h = await startHarness({ snapshot: withPolicy });
t.teardown(() => h.close());

const ask = async (method: string, path: string, body?: string) =>
  h.call(path, {
    method,
    headers: {
      authorization: `Bearer ${await h.token()}`,
      ...(body ? { 'content-type': 'application/json' } : {}),
      ...(path.startsWith('/v1/messages') ? { 'anthropic-version': '2023-06-01' } : {}),
    },
    ...(body ? { body } : {}),
  });

const REPLAYS: [string, string][] = [
  ['GET', '/v1/responses/resp_123'],
  ['GET', '/v1/responses/resp_123/input_items'],
  ['GET', '/v1/chat/completions/chatcmpl_1'],
  ['GET', '/v1/chat/completions/chatcmpl_1/messages'],
  ['GET', '/v1/messages/batches/msgbatch_1/results'],
  ['GET', '/v1/conversations/conv_1/items'],
  ['GET', '/v1/files/file_1/content'],
  ['POST', '/v1/batches'],
  ['POST', '/v1/completions'],
];

t.test('routes that can replay model output are refused, recorded, never forwarded', async (t) => {
  for (const [method, path] of REPLAYS) {
    const before = h.upstream.received.length;
    const audited = h.audit.length;
    const res = await ask(method, path, method === 'POST' ? '{"input_file_id":"file_1"}' : undefined);
    t.equal(res.status, 403, `${method} ${path}`);
    t.match(JSON.parse(res.text), {
      type: 'error',
      error: { type: 'permission_error', message: /not available under a tool-call policy/ },
    });
    t.equal(h.upstream.received.length, before, 'the upstream was not asked');
    t.ok(await until(() => h.audit.length > audited), 'recorded');
    t.match(h.audit.at(-1), {
      table: 'llm_audit_log',
      path,
      status: 403,
      decision: 'deny',
      error: /refused under a tool-call policy/,
    });
  }
});

t.test('routes whose answers carry no model output go through', async (t) => {
  const models = await ask('GET', '/v1/models');
  t.equal(models.status, 200);
  t.match(JSON.parse(models.text), { object: 'list' });
  const count = await ask(
    'POST',
    '/v1/messages/count_tokens',
    JSON.stringify({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'hi' }] }),
  );
  t.equal(count.status, 200);
  t.same(JSON.parse(count.text), { input_tokens: 42 });
});

t.test('without a tool rule every route passes as before', async (t) => {
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  t.teardown(() => h.writeSnapshot(withPolicy(h.upstream.url)));
  const before = h.upstream.received.length;
  const res = await ask('GET', '/v1/responses/resp_123');
  t.not(res.status, 403);
  t.equal(h.upstream.received.length, before + 1, 'forwarded');
});
