import t from 'tap';
import OpenAI from 'openai';
import { until } from '../../fixtures/eventually.ts';
import { startLlmUpstream } from '../../fixtures/llm-upstream.ts';
import { anthropicBody, baseSnapshot, PLATFORM_KEY, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The governance llm_policy enforced by llmproxy (docs/decisions.md, "The governance llm policy reaches
// the proxy"): models and providers allow/deny globs (each allow list a gate, denies union), refused with
// the spec's 403 and recorded as `deny` with the reason, whether or not the org inspects; credential_mode
// and upstream with the settings as one hierarchy.
const h = await startHarness();
t.teardown(() => h.close());
const second = await startLlmUpstream();
t.teardown(() => second.close());

type Doc = {
  platform: Record<string, unknown>;
  orgs: Record<string, { config: Record<string, unknown>; flags?: Record<string, boolean> }>;
  agents: Record<string, { config: Record<string, unknown> }>;
};
/** The harness's snapshot with `edit` applied. */
async function snapshotWith(edit: (d: Doc) => void) {
  const d = baseSnapshot(h.upstream.url) as unknown as Doc;
  edit(d);
  await h.writeSnapshot(d);
  const verdict = h.logs.filter((l) => /^policy snapshot (reloaded|reload refused)/.test(String(l.msg))).at(-1);
  t.equal(verdict?.msg, 'policy snapshot reloaded', 'the proxy loaded the snapshot');
}

const chat = (model: string) => JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] });

/** One call's answer and the record it left. */
async function outcome(path: string, body: string, headers: Record<string, string> = {}, method = 'POST') {
  const before = h.audit.length;
  const received = h.upstream.received.length;
  const r =
    method === 'POST'
      ? await post(h, path, body, headers)
      : await h.call(path, { method, headers: { 'x-api-key': await h.token(), ...headers } });
  await until(() => h.proxy.proxy.inFlight === 0 && h.audit.length > before);
  return { status: r.status, body: r.text, record: h.audit.at(-1)!, forwarded: h.upstream.received.length > received };
}

t.test('models: every allow list is a gate, every deny refuses; the SDKs read a 403', async (t) => {
  await snapshotWith((d) => {
    d.platform.llm_policy = { value: { models: { allow: ['claude-*', 'gpt-*'], deny: ['*-preview'] } } };
    d.orgs['org-1'].config.llm_policy = { value: { models: { allow: ['claude-*'] } } };
  });
  const token = await h.token();
  const ok = await h.anthropic(token).messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.equal(ok.type, 'message', 'a model every gate allows');

  const err = await h
    .openai(token)
    .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })
    .catch((e: unknown) => e);
  t.ok(err instanceof OpenAI.PermissionDeniedError, 'gpt-4o passes the platform gate, not the org one: 403');
  t.match((err as { error: unknown }).error, { type: 'content_policy_violation' });

  const gated = await outcome('/v1/chat/completions', chat('gpt-4o'));
  t.same(JSON.parse(gated.body), {
    type: 'error',
    error: { type: 'content_policy_violation', message: 'Request blocked by content security policy.' },
  });
  t.notOk(gated.forwarded, 'never forwarded');
  t.match(gated.record, {
    table: 'llm_audit_log',
    status: 403,
    decision: 'deny',
    model: 'gpt-4o',
    error: 'llm_policy: model "gpt-4o" is on no allow list of ["claude-*"]',
  });
  const denied = await outcome('/v1/messages', anthropicBody('hi', { model: 'claude-x-preview' }));
  t.equal(denied.status, 403);
  t.match(denied.record, {
    decision: 'deny',
    error: 'llm_policy: model "claude-x-preview" matches deny glob "*-preview"',
  });

  const twice = await outcome('/v1/messages', anthropicBody('hi', { Model: 'gpt-4o' }));
  t.equal(twice.status, 403, 'a second `model` in another letter case is read too (a Go upstream takes it)');
  t.match(twice.record, { error: /model "gpt-4o"/ });

  const batch = await outcome(
    '/v1/messages/batches',
    JSON.stringify({ requests: [{ custom_id: 'a', params: JSON.parse(anthropicBody('hi', { model: 'gpt-4o' })) }] }),
  );
  t.equal(batch.status, 403, 'a pass-through route reaches no model the policy keeps the agent from');
  t.match(batch.record, { decision: 'deny', error: /model "gpt-4o" is on no allow list/ });
  const unreadable = await outcome('/v1/messages/batches', '{"requests": [{"params": {"model": "claude-x"');
  t.equal(unreadable.status, 403, 'a body that may name a model unreadably is refused');
  t.match(unreadable.record, { error: /cannot read/ });
});

t.test('models and providers are access policy: enforced when the org does not inspect', async (t) => {
  await snapshotWith((d) => {
    d.orgs['org-1'].flags = { 'inspect:llm': false };
    d.orgs['org-1'].config.llm_policy = { value: { models: { deny: ['claude-opus-*'] } } };
  });
  const r = await outcome('/v1/messages', anthropicBody('hi', { model: 'claude-opus-4' }));
  t.equal(r.status, 403);
  t.match(r.record, { decision: 'deny', findings: [], error: /deny glob "claude-opus-\*"/ });
  t.equal((await outcome('/v1/messages', anthropicBody('hi'))).status, 200);
});

t.test('providers: anthropic for Messages, openai for chat and Responses', async (t) => {
  await snapshotWith((d) => {
    d.orgs['org-1'].config.llm_policy = { value: { providers: { allow: ['anthropic', 'openai'], deny: ['open*'] } } };
  });
  const token = await h.token();
  t.equal(
    (await h.anthropic(token).messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [] })).type,
    'message',
  );
  const err = await h
    .openai(token)
    .responses.create({ model: 'gpt-4o', input: 'hi' })
    .catch((e: unknown) => e);
  t.ok(err instanceof OpenAI.PermissionDeniedError, 'Responses reach openai: denied');
  const r = await outcome('/v1/chat/completions', chat('gpt-4o'));
  t.equal(r.status, 403);
  t.notOk(r.forwarded);
  t.match(r.record, { decision: 'deny', error: 'llm_policy: provider openai matches deny glob "open*"' });

  await snapshotWith((d) => {
    d.platform.llm_policy = { value: { providers: { allow: ['openai'] } } };
  });
  const models = await outcome('/v1/models', '', { 'anthropic-version': '2023-06-01' }, 'GET');
  t.equal(models.status, 403, 'the gate holds on every route of the provider, not inference alone');
  t.match(models.record, { error: 'llm_policy: provider anthropic is on no allow list of ["openai"]' });
});

t.test('credential_mode: llm_policy and the setting as one hierarchy', async (t) => {
  const own = 'sk-agents-own-key-123';
  const withOwnKey = async () =>
    h.call('/v1/messages', {
      headers: {
        'content-type': 'application/json',
        'x-api-key': await h.token(),
        authorization: `Bearer ${own}`,
      },
      body: anthropicBody('hi'),
    });
  await snapshotWith((d) => {
    d.platform.credential_mode = { value: 'platform' };
    d.orgs['org-1'].config.llm_policy = { value: { credential_mode: 'passthrough' } };
  });
  t.equal((await withOwnKey()).status, 200);
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], own, "passthrough: the agent's own key");

  await snapshotWith((d) => {
    d.platform.llm_policy = { value: { credential_mode: 'platform' }, locked: true };
    d.orgs['org-1'].config.credential_mode = { value: 'passthrough' };
  });
  t.equal((await withOwnKey()).status, 200);
  t.equal(
    h.upstream.received.at(-1)!.headers['x-api-key'],
    PLATFORM_KEY,
    'a locked platform llm_policy: the platform key, whatever the org setting says',
  );

  await snapshotWith((d) => {
    d.platform.credential_mode = { value: 'platform', locked: true };
    d.agents['agent-1'].config.llm_policy = { value: { credential_mode: 'passthrough' } };
  });
  t.equal((await withOwnKey()).status, 200);
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], PLATFORM_KEY, 'a locked setting is not escaped');
});

t.test('upstream: llm_policy names a base URL by wire format or by provider', async (t) => {
  await snapshotWith((d) => {
    d.orgs['org-1'].config.llm_policy = { value: { upstream: { anthropic: `${second.url}/` } } };
  });
  const token = await h.token();
  const before = { first: h.upstream.received.length, second: second.received.length };
  const msg = await h.anthropic(token).messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.equal(msg.type, 'message');
  t.equal(second.received.length, before.second + 1, "the provider's calls go to llm_policy's upstream");
  t.equal(second.received.at(-1)!.path, '/v1/messages');
  await h.openai(token).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
  t.equal(h.upstream.received.length, before.first + 1, "another provider's keep downstream_url");

  await snapshotWith((d) => {
    d.orgs['org-1'].config.llm_policy = {
      value: { upstream: { openai: second.url, 'openai-chat': h.upstream.url } },
    };
    d.orgs['org-1'].config.upstream = { value: { 'anthropic-messages': second.url } };
  });
  const mark = { first: h.upstream.received.length, second: second.received.length };
  await h.openai(token).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
  await h.openai(token).responses.create({ model: 'gpt-4o', input: 'hi' });
  t.equal(h.upstream.received.length, mark.first + 1, "chat: the format's own key");
  t.equal(second.received.length, mark.second + 1, "Responses: the provider's key");
  await h.anthropic(token).messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [] });
  t.equal(
    h.upstream.received.length,
    mark.first + 2,
    'at one scope llm_policy.upstream stands in for the setting: Messages keep downstream_url',
  );
});

t.test('no governance: nothing resolved for the call', async (t) => {
  await snapshotWith(() => {});
  const r = await outcome('/v1/messages', anthropicBody('hi', { model: 'anything-preview' }));
  t.equal(r.status, 200);
  t.match(r.record, { decision: 'allow', error: null });
});

t.test('providers with --translate: the provider the call reaches, not the one the agent speaks', async (t) => {
  const tr = await startHarness({
    proxy: { translate: true, translateUpstreamFormat: 'openai-chat' },
    snapshot: (url) => {
      const d = baseSnapshot(url) as unknown as Doc;
      d.orgs['org-1'].config.llm_policy = { value: { providers: { deny: ['anthropic'] } } };
      return d;
    },
  });
  t.teardown(() => tr.close());
  const msg = await tr.anthropic(await tr.token()).messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.equal(msg.type, 'message', 'an Anthropic-speaking agent reaches openai: allowed');
  t.equal(tr.upstream.received.at(-1)!.path, '/v1/chat/completions');
});
