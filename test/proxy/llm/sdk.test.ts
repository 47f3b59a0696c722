import t from 'tap';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { AGENT_SECRET, PLATFORM_KEY, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The official SDKs against the proxy, every wire format, streaming and not.
const h = await startHarness();
t.teardown(() => h.close());

const lastUpstream = () => h.upstream.received.at(-1)!;
const lastAudit = () => h.audit.at(-1)!;

t.test('anthropic messages through the SDK: platform key injected, prefix in the system prompt, audited', async (t) => {
  const token = await h.token();
  const client = h.anthropic(token);
  const msg = await client.messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    system: 'Be brief.',
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.equal(msg.content[0].type === 'text' && msg.content[0].text, REPLY);
  const up = lastUpstream();
  t.equal(up.headers['x-api-key'], PLATFORM_KEY, 'the agent secret replaced the token');
  t.notOk(up.headers.authorization, 'no agent credential travels upstream');
  t.match(
    up.body!.system,
    /^\[dvx security context\] You are agent "builder" \(agent-1\) of organization org-1 in enclave "test-enclave"\..*\n\nBe brief\.$/s,
  );
  t.ok(up.headers['anthropic-version'], 'SDK headers pass through');
  t.match(lastAudit(), {
    stream: 'audit',
    table: 'llm_audit_log',
    org_id: 'org-1',
    agent_id: 'agent-1',
    agent_name: 'builder',
    enclave_id: 'enc-1',
    format: 'anthropic-messages',
    model: 'claude-sonnet-4-5',
    status: 200,
    upstream_status: 200,
    input_tokens: 12,
    output_tokens: 7,
    decision: 'allow',
    findings: [],
    inspection_failopen: false,
  });
  t.match(lastAudit().id, /^[A-Za-z0-9_-]+$/);
});

t.test('anthropic streaming through the SDK', async (t) => {
  const client = h.anthropic(await h.token());
  const stream = client.messages.stream({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'stream please' }],
  });
  let text = '';
  stream.on('text', (d) => (text += d));
  const final = await stream.finalMessage();
  t.equal(text, REPLY);
  t.equal(final.usage.output_tokens, 7);
  await new Promise((r) => setTimeout(r, 20));
  t.match(lastAudit(), { format: 'anthropic-messages', status: 200, input_tokens: 12, output_tokens: 7 });
});

t.test('openai chat through the SDK, plain and streamed; the token rides in Authorization', async (t) => {
  const client = h.openai(await h.token());
  const out = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
  t.equal(out.choices[0].message.content, REPLY);
  const up = lastUpstream();
  t.equal(up.headers.authorization, `Bearer ${PLATFORM_KEY}`);
  const messages = up.body!.messages as { role: string; content: string }[];
  t.equal(messages[0].role, 'system');
  t.match(messages[0].content, /^\[dvx security context\]/);
  t.same(messages[1], { role: 'user', content: 'hi' });
  t.match(lastAudit(), { format: 'openai-chat', input_tokens: 11, output_tokens: 6 });

  const stream = await client.chat.completions.create({
    model: 'gpt-4o',
    stream: true,
    messages: [{ role: 'user', content: 'hi' }],
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  t.equal(text, REPLY);
});

t.test('openai responses through the SDK, plain and streamed; instructions carry the prefix', async (t) => {
  const client = h.openai(await h.token());
  const out = await client.responses.create({ model: 'gpt-4o', input: 'hi', instructions: 'Be brief.' });
  t.equal(out.output_text, REPLY);
  t.match(lastUpstream().body!.instructions, /^\[dvx security context\].*\n\nBe brief\.$/s);
  const stream = await client.responses.create({ model: 'gpt-4o', input: 'hi', stream: true });
  let text = '';
  for await (const event of stream) if (event.type === 'response.output_text.delta') text += event.delta;
  t.equal(text, REPLY);
  await new Promise((r) => setTimeout(r, 20));
  t.match(lastAudit(), { format: 'openai-responses', input_tokens: 10, output_tokens: 5 });
});

t.test('a blocked request: 403 content_policy_violation through each SDK, nothing sent upstream', async (t) => {
  const before = h.upstream.received.length;
  const anthropic = h.anthropic(await h.token());
  const err = await anthropic.messages
    .create({
      model: 'claude-sonnet-4-5',
      max_tokens: 8,
      messages: [{ role: 'user', content: `db pw ${AGENT_SECRET}` }],
    })
    .catch((e) => e);
  t.ok(err instanceof Anthropic.PermissionDeniedError, 'PermissionDeniedError');
  t.equal(err.status, 403);
  t.same(err.error, {
    type: 'error',
    error: { type: 'content_policy_violation', message: 'Request blocked by content security policy.' },
  });
  const openai = h.openai(await h.token());
  const err2 = await openai.chat.completions
    .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'key AKIAIOSFODNN7EXAMPLE' }] })
    .catch((e) => e);
  t.ok(err2 instanceof OpenAI.PermissionDeniedError);
  t.equal(h.upstream.received.length, before, 'the upstream never saw them');
  t.match(lastAudit(), {
    status: 403,
    decision: 'block',
    findings: [{ inspector_type: 'api_key', severity: 'block', match: 'AKIA****', location: 'request_body' }],
  });
  t.notOk(JSON.stringify(h.audit).includes(AGENT_SECRET), 'the secret is in no audit record');
  t.notOk(JSON.stringify(h.logs).includes(AGENT_SECRET), 'nor in any log line');
});

t.test('warn findings proceed and are audited', async (t) => {
  const client = h.anthropic(await h.token());
  await client.messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'mail me at a@example.com' }],
  });
  t.match(lastAudit(), { status: 200, findings: [{ inspector_type: 'pii', severity: 'warn', match: 'a@ex****' }] });
});
