import t from 'tap';
import { request } from 'undici';
import type { CallContext } from '../../../proxy/llm/context.ts';
import { denialMessage } from '../../../proxy/llm/tools/denial.ts';
import type { Decide, ToolCall, ToolVerdict } from '../../../proxy/llm/tools/types.ts';
import { compileToolPolicy } from '../../../pipeline/tool-policy/compile.ts';
import { evaluateToolCall } from '../../../pipeline/tool-policy/evaluate.ts';
import type { ScriptedTool } from '../../fixtures/llm-upstream.ts';
import { recordAfter, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// Streamed answers with tool calls, through the real proxy and the official SDKs, each call decided by
// the evaluator over a tool policy (ProxyDeps.toolDecider, the seam the tool-call step fills in
// production): the tool gate (proxy/llm/tools/stream-gate.ts) between the upstream and the agent.

const policy = compileToolPolicy({
  inspectors: [
    {
      name: 'payments',
      rules: [
        { tool: 'transfer', verdict: 'deny', summary: 'Large transfers are not allowed', arg_gt: { amount: 500 } },
        { tool: 'wire', verdict: 'require_approval', summary: 'Wires need a person' },
      ],
    },
  ],
})!;

const held: { call: ToolCall; release: (v: ToolVerdict) => void }[] = [];
const decider =
  (ctx: CallContext): Decide =>
  (call) => {
    const e = evaluateToolCall(policy, { name: call.name, arguments: call.arguments, model: ctx.model });
    if (e.verdict === 'allow') return Promise.resolve({ allow: true, message: '' });
    if (e.verdict === 'deny')
      return Promise.resolve({ allow: false, message: denialMessage(call, e.reason, 'detailed') });
    return new Promise((release) => held.push({ call, release }));
  };

const h = await startHarness({ toolDecider: decider });
t.teardown(() => h.close());

const tools = (list: ScriptedTool[], reply?: string) => ({
  headers: { 'x-test-tools': JSON.stringify(list), ...(reply ? { 'x-test-reply': reply } : {}) },
});
const PARALLEL: ScriptedTool[] = [
  { name: 'get_weather', input: { city: 'Paris' } },
  { name: 'transfer', input: { amount: 900 } },
];
const DENIED = (id: string) =>
  `[dvx] The tool call transfer (id ${id}) was not run: denied by rule payments.rules[0] ` +
  '(Large transfers are not allowed): amount is 900, greater than 500.';
const ask = { model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user' as const, content: 'pay' }] };

t.test('allowed calls: the stream arrives byte for byte', async (t) => {
  const { headers } = tools([{ name: 'get_weather', input: { city: 'Paris' } }], 'Checking the weather.');
  const body = JSON.stringify({ ...ask, stream: true });
  const through = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), ...headers },
    body,
  });
  const direct = await request(`${h.upstream.url}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
  t.equal(through.text, await direct.body.text());
});

t.test('anthropic SDK stream: the denied call a text block, the allowed one intact', async (t) => {
  const client = h.anthropic(await h.token());
  const msg = await client.messages.stream(ask, tools(PARALLEL, 'Paying now.')).finalMessage();
  t.same(
    msg.content.map((b) => b.type),
    ['text', 'tool_use', 'text'],
  );
  t.match(msg.content[1], { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } });
  t.equal(msg.content[2].type === 'text' && msg.content[2].text, DENIED('toolu_2'));
  t.equal(msg.stop_reason, 'tool_use');
});

t.test('openai chat SDK stream: the denied call out, its denial in content', async (t) => {
  const client = h.openai(await h.token());
  const c = await client.chat.completions
    .stream(
      { model: 'gpt-4o', messages: [{ role: 'user', content: 'pay' }] },
      tools([...PARALLEL].reverse(), 'Paying.'),
    )
    .finalChatCompletion();
  const m = c.choices[0].message;
  t.match(m.content, new RegExp(`^Paying\\.\\n\\n${DENIED('call_1').replace(/[.()[\]]/g, '\\$&')}$`));
  t.same(
    m.tool_calls?.map((x) => x.type === 'function' && [x.id, x.function.name]),
    [['call_2', 'get_weather']],
  );
  t.equal(c.choices[0].finish_reason, 'tool_calls');
});

t.test('openai responses SDK stream: the denied function_call a message item in place', async (t) => {
  const client = h.openai(await h.token());
  const r = await client.responses.stream({ model: 'gpt-4o', input: 'pay' }, tools(PARALLEL)).finalResponse();
  t.same(
    r.output.map((o) => `${o.type}:${o.id}`),
    ['function_call:fc_1', 'message:msg_dvx_fc_2'],
  );
  const m = r.output[1];
  t.equal(m.type === 'message' && m.content[0].type === 'output_text' && m.content[0].text, DENIED('call_2'));
});

t.test('a held call: the text before it reaches the agent first; approval releases it', async (t) => {
  const before = held.length;
  const res = await request(`${h.url}/v1/messages`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-api-key': await h.token(),
      ...tools([{ name: 'wire', input: { to: 'x' } }], 'Wiring the money.').headers,
    },
    body: JSON.stringify({ ...ask, stream: true }),
    dispatcher: h.dispatcher,
  });
  let got = '';
  for await (const chunk of res.body) {
    got += chunk.toString();
    if (got.includes('money.') && held.length > before && !got.includes('tool_use')) {
      t.pass('the text arrived while the call is held');
      held[before].release({ allow: true, message: '' });
    }
  }
  t.match(got, /"type":"tool_use","id":"toolu_1","name":"wire"/);
  t.match(got, /event: message_stop/);
});

t.test('the agent leaving while a streamed call is held: the record says so, the proxy goes on', async (t) => {
  const before = held.length;
  const audits = h.audit.length;
  const abort = new AbortController();
  const res = await request(`${h.url}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${await h.token()}`,
      ...tools([{ name: 'wire', input: {} }]).headers,
    },
    body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'pay' }] }),
    dispatcher: h.dispatcher,
    signal: abort.signal,
  });
  t.equal(res.statusCode, 200);
  t.ok(await until(() => held.length > before), 'held');
  abort.abort();
  t.ok(await until(() => h.audit.length > audits), 'the call has its record');
  t.match(h.audit.at(-1), { error: 'the agent closed the connection before the answer was delivered' });
  held[before].release({ allow: true, message: '' });
  const client = h.anthropic(await h.token());
  const next = await client.messages.stream(ask, tools([{ name: 'get_weather', input: {} }])).finalMessage();
  t.equal(next.content.at(-1)?.type, 'tool_use', 'the proxy goes on');
});

t.test('a stream in a content coding the proxy cannot undo is refused, never relayed unexamined', async (t) => {
  // `gzip, gzip`: the dispatcher does not undo a stacked coding, the agent's fetch does. The gate
  // would see compressed bytes (no event in them) and let them all through.
  const client = h.anthropic(await h.token());
  const seen = h.audit.length;
  const { headers } = tools(PARALLEL, 'Paying now.');
  const got = await client.messages
    .stream(ask, { headers: { ...headers, 'x-test-behavior': 'encode:gzip2-stream' } })
    .finalMessage()
    .then(
      (m) => m.content.filter((b) => b.type === 'tool_use').map((b) => b.type === 'tool_use' && b.name),
      (err: Error) => err,
    );
  t.not(
    Array.isArray(got) && got.includes('transfer'),
    true,
    'the denied transfer never reaches the agent as a tool_use',
  );
  t.type(got, Error, 'the agent gets an error, not the answer');
  const record = await recordAfter(h, seen);
  t.match(record.error, /content coding gzip, gzip/, 'the record says why');
});
