import t from 'tap';
import { request } from 'undici';
import type { CallContext } from '../../../proxy/llm/context.ts';
import { denialMessage } from '../../../proxy/llm/tools/denial.ts';
import type { Decide, ToolCall, ToolVerdict } from '../../../proxy/llm/tools/types.ts';
import { compileToolPolicy } from '../../../pipeline/tool-policy/compile.ts';
import { evaluateToolCall } from '../../../pipeline/tool-policy/evaluate.ts';
import type { ScriptedTool } from '../../fixtures/llm-upstream.ts';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// Plain (non-streamed) answers with tool calls, through the real proxy and the official SDKs, each
// call decided by the evaluator over a tool policy. The decider comes in through ProxyDeps.toolDecider,
// the seam the tool-call step fills in production; `require_approval` here waits on the test (a
// person, in production), so a held call, its release and an agent that leaves are all real.

const policy = compileToolPolicy({
  inspectors: [
    {
      name: 'payments',
      rules: [
        { tool: 'transfer', verdict: 'deny', summary: 'Large transfers are not allowed', arg_gt: { amount: 500 } },
        { tool: 'wire', verdict: 'require_approval', summary: 'Wires need a person' },
      ],
    },
    { rules: [{ tool: 'rm_*', verdict: 'deny' }] },
  ],
})!;

/** Calls held for approval, released by the test. */
const held: { call: ToolCall; release: (v: ToolVerdict) => void }[] = [];
const decided: { call: ToolCall; verdict: string; model: string | null }[] = [];
const decider = (ctx: CallContext): Decide => {
  return (call) => {
    const e = evaluateToolCall(policy, { name: call.name, arguments: call.arguments, model: ctx.model });
    decided.push({ call, verdict: e.verdict, model: ctx.model });
    if (e.verdict === 'allow') return Promise.resolve({ allow: true, message: '' });
    if (e.verdict === 'deny')
      return Promise.resolve({ allow: false, message: denialMessage(call, e.reason, 'detailed') });
    return new Promise((release) => held.push({ call, release }));
  };
};

const h = await startHarness({ toolDecider: decider });
t.teardown(() => h.close());

/** The scripted calls as a header: JSON, non-ASCII escaped (a header value is ASCII). */
const tools = (list: ScriptedTool[], reply?: string) => ({
  headers: {
    'x-test-tools': JSON.stringify(list).replace(
      /[\u0080-\uffff]/g,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
    ),
    ...(reply ? { 'x-test-reply': reply } : {}),
  },
});
const ask = { model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user' as const, content: 'pay' }] };

/** The upstream's own bytes for the same scripted answer (it answers by the headers and the model alone). */
async function upstreamBytes(path: string, body: unknown, headers: Record<string, string>): Promise<string> {
  const res = await request(`${h.upstream.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return res.body.text();
}

t.test('anthropic: allowed calls arrive byte for byte', async (t) => {
  const list = [
    { name: 'transfer', input: { amount: 20, memo: 'caf\u00e9 \u2713' } },
    { name: 'get_weather', input: { city: 'Paris' } },
  ];
  const { headers } = tools(list, 'Paying.');
  const token = await h.token();
  const through = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': token, ...headers },
    body: JSON.stringify(ask),
  });
  t.equal(through.status, 200);
  t.equal(through.text, await upstreamBytes('/v1/messages', ask, headers), 'the original bytes');
  t.equal(through.headers['content-length'], String(Buffer.byteLength(through.text)));
  t.same(
    decided.slice(-2).map((d) => [d.call.seq, d.call.id, d.call.name, d.verdict, d.model]),
    [
      [0, 'toolu_1', 'transfer', 'allow', 'claude-sonnet-4-5'],
      [1, 'toolu_2', 'get_weather', 'allow', 'claude-sonnet-4-5'],
    ],
  );
});

t.test('anthropic SDK: a denied call among parallel ones becomes a text block; the rest intact', async (t) => {
  const client = h.anthropic(await h.token());
  const msg = await client.messages.create(
    ask,
    tools(
      [
        { name: 'get_weather', input: { city: 'Paris' } },
        { name: 'transfer', input: { amount: 900 } },
      ],
      'Paying.',
    ),
  );
  t.same(
    msg.content.map((b) => b.type),
    ['text', 'tool_use', 'text'],
  );
  t.match(msg.content[1], { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } });
  t.equal(
    msg.content[2].type === 'text' && msg.content[2].text,
    '[dvx] The tool call transfer (id toolu_2) was not run: denied by rule payments.rules[0] ' +
      '(Large transfers are not allowed): amount is 900, greater than 500.',
  );
  t.equal(msg.stop_reason, 'tool_use', 'an allowed call remains');
  t.same(msg.usage, { input_tokens: 20, output_tokens: 9 });

  const all = await client.messages.create(ask, tools([{ name: 'rm_rf', input: { path: '/' } }]));
  t.same(
    all.content.map((b) => b.type),
    ['text'],
  );
  t.equal(all.stop_reason, 'end_turn', 'no allowed call left: the turn ends');
});

t.test('arguments that do not parse, or are not an object, fail closed', async (t) => {
  const anthropic = h.anthropic(await h.token());
  // A plain Anthropic answer carries an object `input`; the scripted one here is a string.
  const msg = await anthropic.messages.create(ask, tools([{ name: 'transfer', arguments: '{"amount": 9' }]));
  t.equal(msg.content[0].type, 'text');
  t.match(
    msg.content[0].type === 'text' && msg.content[0].text,
    /are not a JSON object, so every arg_gt bound counts as met \(fail closed\)\.$/,
  );
  const chat = h.openai(await h.token());
  const res = await chat.chat.completions.create(
    { model: 'gpt-4o', messages: [{ role: 'user', content: 'pay' }] },
    tools([{ name: 'transfer', arguments: '{"amount": 9' }]),
  );
  t.match(
    res.choices[0].message.content,
    /do not parse as JSON, so every arg_gt bound counts as met \(fail closed\)\.$/,
  );
  t.notOk(res.choices[0].message.tool_calls);
});

t.test('openai chat SDK: denied call out of tool_calls, its denial in content', async (t) => {
  const client = h.openai(await h.token());
  const body = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'pay' }] };
  const res = await client.chat.completions.create(
    body,
    tools([
      { name: 'transfer', input: { amount: 1e6 } },
      { name: 'get_weather', input: { city: 'Oslo' } },
    ]),
  );
  const m = res.choices[0].message;
  t.equal(m.tool_calls?.length, 1);
  t.match(m.tool_calls?.[0], {
    id: 'call_2',
    type: 'function',
    function: { name: 'get_weather', arguments: '{"city":"Oslo"}' },
  });
  t.match(m.content, /^\[dvx\] The tool call transfer \(id call_1\) was not run: denied by rule payments\.rules\[0\]/);
  t.equal(res.choices[0].finish_reason, 'tool_calls');
  t.same(res.usage, { prompt_tokens: 20, completion_tokens: 9, total_tokens: 29 });

  const text = await client.chat.completions.create(body, tools([{ name: 'rm_all', input: {} }], 'Deleting.'));
  t.equal(
    text.choices[0].message.content,
    'Deleting.\n\n[dvx] The tool call rm_all (id call_1) was not run: denied by rule inspectors[1].rules[0].',
  );
  t.notOk('tool_calls' in text.choices[0].message, 'tool_calls dropped when empty');
  t.equal(text.choices[0].finish_reason, 'stop');

  const headers = tools([{ name: 'get_weather', arguments: '{ "city" : "Oslo" }' }]).headers;
  const raw = await h.call('/v1/chat/completions', {
    headers: { 'content-type': 'application/json', authorization: `Bearer ${await h.token()}`, ...headers },
    body: JSON.stringify(body),
  });
  t.equal(raw.text, await upstreamBytes('/v1/chat/completions', body, headers), 'allowed: the original bytes');
});

t.test('openai responses SDK: a denied function_call becomes a message item in place', async (t) => {
  const client = h.openai(await h.token());
  const res = await client.responses.create(
    { model: 'gpt-4o', input: 'pay' },
    tools(
      [
        { name: 'get_weather', input: { city: 'Rome' } },
        { name: 'rm_home', input: {} },
      ],
      'On it.',
    ),
  );
  t.same(
    res.output.map((o) => o.type),
    ['message', 'function_call', 'message'],
  );
  t.match(res.output[1], { type: 'function_call', call_id: 'call_1', name: 'get_weather' });
  t.match(res.output[2], {
    type: 'message',
    role: 'assistant',
    content: [
      {
        type: 'output_text',
        text: '[dvx] The tool call rm_home (id call_2) was not run: denied by rule inspectors[1].rules[0].',
      },
    ],
  });
  t.match(res.output_text, /On it\.[\s\S]*rm_home/, "the SDK's output_text reads the denial");
});

t.test('a held call: delivered as it came once approved, or denied', async (t) => {
  const client = h.anthropic(await h.token());
  const before = held.length;
  const pending = client.messages.create(ask, tools([{ name: 'wire', input: { to: 'x', amount: 5 } }]));
  t.ok(await until(() => held.length > before), 'the call is held');
  held[before].release({ allow: true, message: '' });
  const msg = await pending;
  t.match(msg.content[0], { type: 'tool_use', name: 'wire', input: { to: 'x', amount: 5 } });
  t.equal(msg.stop_reason, 'tool_use');

  const refused = client.messages.create(ask, tools([{ name: 'wire', input: {} }]));
  t.ok(await until(() => held.length > before + 1));
  const call = held[before + 1].call;
  held[before + 1].release({ allow: false, message: denialMessage(call, 'denied by a person: not today', 'detailed') });
  const denied = await refused;
  t.equal(
    denied.content[0].type === 'text' && denied.content[0].text,
    '[dvx] The tool call wire (id toolu_1) was not run: denied by a person: not today.',
  );
});

t.test('the agent leaving while a call is held: nothing breaks, the record says so', async (t) => {
  const before = held.length;
  const audits = h.audit.length;
  const abort = new AbortController();
  const pending = request(`${h.url}/v1/messages`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-api-key': await h.token(),
      ...tools([{ name: 'wire', input: {} }]).headers,
    },
    body: JSON.stringify(ask),
    dispatcher: h.dispatcher,
    signal: abort.signal,
  });
  t.ok(await until(() => held.length > before), 'held');
  abort.abort();
  await t.rejects(pending);
  t.ok(await until(() => h.audit.length > audits), 'the call has its record');
  t.match(h.audit.at(-1), { error: 'the agent closed the connection before the answer was delivered' });
  // The decision arriving later finds no one waiting: it changes nothing and throws nowhere.
  held[before].release({ allow: true, message: '' });
  const client = h.anthropic(await h.token());
  const next = await client.messages.create(ask, tools([{ name: 'get_weather', input: {} }]));
  t.equal(next.content[0].type, 'tool_use', 'the proxy goes on');
});

t.test('answers without tool calls, and errors, are untouched', async (t) => {
  const client = h.anthropic(await h.token());
  const seen = decided.length;
  const msg = await client.messages.create(ask);
  t.equal(msg.content[0].type, 'text');
  t.equal(decided.length, seen, 'nothing to decide');
  const err = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-behavior': 'auth' },
    body: JSON.stringify(ask),
  });
  t.equal(err.status, 401, 'an upstream error passes as it came');
});

t.test('translated answers are decided in the agent’s format', async (t) => {
  const ht = await startHarness({
    toolDecider: decider,
    proxy: { translate: true, translateUpstreamFormat: 'openai-chat' },
  });
  t.teardown(() => ht.close());
  const client = ht.anthropic(await ht.token());
  const msg = await client.messages.create(
    ask,
    tools([
      { name: 'get_weather', input: { city: 'Paris' } },
      { name: 'transfer', input: { amount: 501 } },
    ]),
  );
  t.equal(ht.upstream.received.at(-1)!.path, '/v1/chat/completions', 'the upstream spoke chat');
  t.same(
    msg.content.map((b) => b.type),
    ['tool_use', 'text'],
  );
  t.match(msg.content[1], { type: 'text', text: /transfer \(id call_2\) was not run/ });
});

t.test("the test upstream's scripted calls, streamed, as each SDK assembles them", async (t) => {
  // Allowed calls only: whatever the stream relay decides, these arrive as the upstream sent them.
  const list = [
    { name: 'get_weather', input: { city: 'Z\u00fcrich', days: [1, 2] } },
    { name: 'lookup', arguments: '{"q":"a \\"quoted\\" word"}' },
  ];
  const anthropic = h.anthropic(await h.token());
  const msg = await anthropic.messages.stream(ask, tools(list, 'Looking it up.')).finalMessage();
  t.same(
    msg.content.map((b) => (b.type === 'tool_use' ? [b.id, b.name, b.input] : [b.type === 'text' && b.text])),
    [
      ['Looking it up.'],
      ['toolu_1', 'get_weather', { city: 'Z\u00fcrich', days: [1, 2] }],
      ['toolu_2', 'lookup', { q: 'a "quoted" word' }],
    ],
  );
  t.equal(msg.stop_reason, 'tool_use');

  const openai = h.openai(await h.token());
  const chat = await openai.chat.completions
    .stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }, tools(list, 'Looking it up.'))
    .finalChatCompletion();
  t.equal(chat.choices[0].message.content, 'Looking it up.');
  t.same(
    chat.choices[0].message.tool_calls?.map(
      (c) => c.type === 'function' && [c.id, c.function.name, c.function.arguments],
    ),
    [
      ['call_1', 'get_weather', '{"city":"Z\u00fcrich","days":[1,2]}'],
      ['call_2', 'lookup', '{"q":"a \\"quoted\\" word"}'],
    ],
  );
  t.equal(chat.choices[0].finish_reason, 'tool_calls');

  const responses = await openai.responses
    .stream({ model: 'gpt-4o', input: 'x' }, tools(list, 'Looking it up.'))
    .finalResponse();
  t.same(
    responses.output.map((o) =>
      o.type === 'function_call' ? [o.call_id, o.name, o.arguments] : o.type === 'message' ? [o.type] : [],
    ),
    [
      ['message'],
      ['call_1', 'get_weather', '{"city":"Z\u00fcrich","days":[1,2]}'],
      ['call_2', 'lookup', '{"q":"a \\"quoted\\" word"}'],
    ],
  );
  t.equal(responses.output_text, 'Looking it up.');
});
