import { betaTool } from '@anthropic-ai/sdk/helpers/beta/json-schema';
import t from 'tap';
import { opsAgent, runToEnd } from '../../fixtures/ops-agent.ts';
import {
  AGENT_SECRET,
  baseSnapshot,
  type Harness,
  PLATFORM_KEY,
  post,
  startHarness,
} from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// Refused tool calls in conversations the provider holds (docs/tool-policy.md, "Server-held
// conversations"), through the real proxy, with the tool policy authored in the snapshot's
// `llm_policy`. The test upstream holds conversations like the providers (fixtures/
// held-conversations.ts): an Anthropic thread or a Responses chain keeps the ORIGINAL answer, refused
// call included, and refuses (400, the provider's words) a next turn that does not answer every call.
// llmproxy answers the refused ones with error tool results carrying the denial the agent read.

const policy = {
  inspection: {
    inspectors: [{ name: 'ops', rules: [{ tool: 'delete_*', verdict: 'deny', summary: 'Deletions are not allowed' }] }],
  },
};

type Snap = {
  orgs: Record<string, { config: Record<string, unknown> }>;
  agents: Record<string, unknown>;
};
const snapshot = (url: string) => {
  const s = baseSnapshot(url) as Snap;
  s.orgs['org-1'].config.llm_policy = { value: policy };
  s.agents['agent-2'] = {
    org_id: 'org-1',
    group_id: 'g-1',
    name: 'other',
    status: 'active',
    contained: false,
    config: {},
  };
  return s;
};
const secrets = {
  'agent:agent-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY, db_password: AGENT_SECRET },
  'agent:agent-2': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY },
};

const h = await startHarness({ snapshot, secrets });
t.teardown(() => h.close());

const DENIAL =
  /^\[dvx\] The tool call delete_file \(id \S+\) was not run: denied by rule ops\.rules\[0\] \(Deletions are not allowed\)\.$/;

const script = (calls: { name: string; input: unknown }[]) => ({
  'x-test-tools': JSON.stringify(calls),
  'x-test-reply': 'On it.',
});
const WEATHER_AND_DELETE = [
  { name: 'get_weather', input: { city: 'Paris' } },
  { name: 'delete_file', input: { path: '/etc/passwd' } },
];

type Block = { type: string; text?: string; tool_use_id?: string; is_error?: boolean; content?: unknown; id?: string };
type Message = { role: string; content: Block[] | string };

function anthropicTools(ran: string[]) {
  return [
    betaTool({
      name: 'get_weather',
      description: 'Weather of a city',
      inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      run: (input) => {
        ran.push(`get_weather:${input.city}`);
        return 'sunny';
      },
    }),
    betaTool({
      name: 'delete_file',
      description: 'Deletes a file',
      inputSchema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
      run: (input) => {
        ran.push(`delete_file:${input.path}`);
        return 'deleted';
      },
    }),
  ];
}

t.test('Anthropic tool runner, server-held thread: the refused call is answered by an error tool result', async (t) => {
  const ran: string[] = [];
  const client = h.anthropic(await h.token()).withOptions({ defaultHeaders: script(WEATHER_AND_DELETE) });
  const before = h.upstream.received.length;
  const audited = h.audit.length;
  const runner = client.beta.messages.toolRunner({
    model: 'claude-sonnet-4-5',
    max_tokens: 256,
    messages: [{ role: 'user', content: 'Weather in Paris, then clean up.' }],
    tools: anthropicTools(ran),
  });
  const final = await runner.runUntilDone();
  t.same(ran, ['get_weather:Paris'], 'only the allowed tool ran');
  t.equal(final.stop_reason, 'end_turn', 'the loop ended normally');
  t.same(
    final.content.map((b) => b.type),
    ['text'],
  );
  const turns = h.upstream.received.slice(before);
  t.equal(turns.length, 2, 'two turns: the calls, then the answer to the tool results');
  t.same(turns[0].body!.thread, { type: 'create' }, 'the SDK asked the provider to hold the conversation');
  t.match(turns[0].body!.system, /\[dvx security context\]/, 'the thread is created with the security prefix');
  t.equal(turns[1].body!.system, undefined, 'a continuation repeats no system: the thread keeps its own');
  const thread = turns[1].body!.thread as { type: string; previous_message_id: string };
  t.equal(thread.type, 'continue', 'the second turn continues the thread');
  const messages = turns[1].body!.messages as Message[];
  t.equal(messages.length, 1, 'only the new turn is sent');
  const results = (messages[0].content as Block[]).filter((b) => b.type === 'tool_result');
  t.same(
    results.map((b) => [b.tool_use_id, b.is_error === true]),
    [
      ['toolu_2', true],
      ['toolu_1', false],
    ],
    'the refused call answered first by an error result, the allowed one by its run',
  );
  t.match(results[0].content, DENIAL, 'the error result is the denial the agent read');
  t.equal(h.upstream.received.at(-1)!.outcome, 'finished');
  // The call's record says what llmproxy added to the request.
  const calls = () => h.audit.slice(audited).filter((r) => r.table === 'llm_audit_log');
  t.ok(await until(() => calls().length >= 2), 'both calls recorded');
  const record = calls().find((r) => (r.findings as unknown[]).length > 0);
  t.match(record?.findings, [
    {
      inspector_type: 'tool_policy',
      severity: 'log',
      location: 'request_body',
      match: 'tool****',
      description: new RegExp(`refused call delete_file of answer ${thread.previous_message_id}`),
    },
  ]);
  t.ok(
    h.logs.some((l) => /error tool results added/.test(String(l.msg)) && (l.calls as string[])?.[0] === 'toolu_2'),
    'a log line names the call',
  );
});

t.test('Anthropic tool runner, client-held history: nothing is added, the history carries the refusal', async (t) => {
  const ran: string[] = [];
  const client = h.anthropic(await h.token()).withOptions({ defaultHeaders: script(WEATHER_AND_DELETE) });
  const before = h.upstream.received.length;
  const runner = client.beta.messages.toolRunner({
    model: 'claude-sonnet-4-5',
    max_tokens: 256,
    messages: [{ role: 'user', content: 'Weather in Paris, then clean up.' }],
    tools: anthropicTools(ran),
    thread: false,
  });
  const final = await runner.runUntilDone();
  t.same(ran, ['get_weather:Paris']);
  t.equal(final.stop_reason, 'end_turn');
  const turns = h.upstream.received.slice(before);
  t.equal(turns.length, 2);
  t.equal(turns[1].body!.thread, undefined, 'no thread');
  const history = turns[1].body!.messages as Message[];
  const assistant = history.find((m) => m.role === 'assistant')!;
  t.same(
    (assistant.content as Block[]).map((b) => b.type),
    ['text', 'tool_use', 'text'],
    'the assistant turn as the agent received it: the refusal in place of the call',
  );
  t.same(
    (history.at(-1)!.content as Block[]).filter((b) => b.type === 'tool_result').map((b) => b.tool_use_id),
    ['toolu_1'],
    'a result for the allowed call only: none added',
  );
});

/** A first Anthropic turn on a new thread with the scripted calls, as `claims`' agent: the answer. */
async function firstTurn(calls = WEATHER_AND_DELETE, claims: Record<string, unknown> = {}) {
  const res = await post(
    h,
    '/v1/messages',
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      max_tokens: 64,
      thread: { type: 'create' },
      messages: [{ role: 'user', content: 'go' }],
    }),
    script(calls),
    claims,
  );
  if (res.status !== 200) throw new Error(`first turn: ${res.status} ${res.text}`);
  return JSON.parse(res.text) as { id: string; content: Block[]; stop_reason: string };
}

/** The next turn of that thread, with `messages`, as `claims`' agent. */
const continueThread = async (previous: string, messages: unknown, claims: Record<string, unknown> = {}, extra = '') =>
  post(
    h,
    '/v1/messages',
    `{"model":"claude-sonnet-4-5","max_tokens":64,${extra}"thread":${JSON.stringify({ type: 'continue', previous_message_id: previous })},"messages":${JSON.stringify(messages)}}`,
    script(WEATHER_AND_DELETE),
    claims,
  );

t.test('Anthropic: a continuation whose first message is not a user message gets one', async (t) => {
  const first = await firstTurn([{ name: 'delete_file', input: { path: '/' } }]);
  t.equal(first.stop_reason, 'end_turn', 'every call refused: the turn ended');
  t.match(first.content.at(-1)!.text, DENIAL);
  // Nothing to say but to go on: the SDK would send `messages: []`; the provider still needs the result.
  const res = await continueThread(first.id, []);
  t.equal(res.status, 200, 'answered');
  const sent = h.upstream.received.at(-1)!.body!.messages as Message[];
  t.same(sent.length, 1);
  t.equal(sent[0].role, 'user');
  t.match(sent[0].content, [{ type: 'tool_result', tool_use_id: 'toolu_1', is_error: true, content: DENIAL }]);
  // A string content is kept after the results (tool results come first in a user message).
  const again = await firstTurn([{ name: 'delete_file', input: { path: '/' } }]);
  t.equal((await continueThread(again.id, [{ role: 'user', content: 'and now?' }])).status, 200);
  t.match(h.upstream.received.at(-1)!.body!.messages, [
    {
      role: 'user',
      content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', is_error: true },
        { type: 'text', text: 'and now?' },
      ],
    },
  ]);
});

t.test('Anthropic: a refused call the request answers itself is left as sent', async (t) => {
  const first = await firstTurn();
  const own = [
    {
      role: 'user',
      content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' },
        { type: 'tool_result', tool_use_id: 'toolu_2', content: 'I did not run it' },
      ],
    },
  ];
  const res = await continueThread(first.id, own);
  t.equal(res.status, 200, 'answered');
  t.same(
    h.upstream.received.at(-1)!.body!.messages,
    own,
    "the agent's own results, untouched (the body was not re-serialized)",
  );
});

t.test('an agent cannot have results added to another agent’s thread', async (t) => {
  const first = await firstTurn();
  const results = [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] }];
  // agent-2 names agent-1's answer: the memory is per agent, nothing is added, the provider refuses.
  const other = await continueThread(first.id, results, { sub: 'agent-2', agent_name: 'other' });
  t.equal(other.status, 400);
  t.match(
    JSON.parse(other.text),
    {
      type: 'error',
      error: {
        type: 'invalid_request_error',
        message: /`tool_use` ids were found without `tool_result` blocks immediately after: toolu_2\./,
      },
    },
    "the provider's own error reaches the agent",
  );
  const mine = await continueThread(first.id, results);
  t.equal(mine.status, 200, "the owner's continuation is answered");
});

t.test('bodies with prototype keys', async (t) => {
  const first = await firstTurn();
  const results = [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] }];
  // A top-level `__proto__` member and one in a block: kept as members, nothing polluted.
  const res = await continueThread(first.id, results, {}, '"__proto__":{"polluted":true},"constructor":1,');
  t.equal(res.status, 200, 'answered');
  const raw = h.upstream.received.at(-1)!.raw.toString();
  t.match(raw, /"__proto__":\{"polluted":true\}/, 'the member is still in the body');
  t.match(raw, /"tool_use_id":"toolu_2","is_error":true/);
  t.equal(({} as Record<string, unknown>).polluted, undefined);
  // Answer ids that are prototype names: unknown answers, forwarded as sent (the upstream: no such thread).
  for (const id of ['__proto__', 'constructor', 'hasOwnProperty', 'toString']) {
    const r = await continueThread(id, results);
    t.equal(r.status, 404, `${id}: no thread`);
    t.equal(
      h.upstream.received.at(-1)!.body!.messages && (h.upstream.received.at(-1)!.body!.messages as unknown[]).length,
      1,
    );
  }
});

for (const stream of [false, true])
  t.test(
    `OpenAI Agents SDK with previousResponseId${stream ? ', streamed' : ''}: the refused call is answered by an error output`,
    async (t) => {
      const ran: string[] = [];
      const plain = h.openai(await h.token());
      // The chain's first answer, a text one: the run continues it.
      const primer = await plain.responses.create({ model: 'gpt-4o', input: 'Hello.' });
      const client = plain.withOptions({
        defaultHeaders: script([
          { name: 'get_weather', input: { city: 'Oslo' } },
          { name: 'delete_file', input: { path: '/srv/data' } },
        ]),
      });
      const agent = opsAgent(client, ran);
      const before = h.upstream.received.length;
      const output = await runToEnd(agent, 'Weather in Oslo, then clean up.', {
        stream,
        previousResponseId: primer.id,
      });
      t.same(ran, ['get_weather:Oslo'], 'only the allowed tool ran');
      t.equal(output, 'On it.', "the loop ended on the model's text");
      const turns = h.upstream.received.slice(before);
      t.equal(turns.length, 2);
      t.equal(turns[0].body!.previous_response_id, primer.id, 'the run continues the chain');
      t.ok(String(turns[1].body!.previous_response_id).startsWith('resp_held_'), 'and its own answer');
      const input = turns[1].body!.input as { type: string; call_id?: string; output?: unknown }[];
      t.same(
        input.map((i) => [i.type, i.call_id]),
        [
          ['function_call_output', 'call_2'],
          ['function_call_output', 'call_1'],
        ],
        'only the new items are sent: the refusal first, then the allowed call’s output',
      );
      t.match(input[0].output, DENIAL);
    },
  );

t.test('Responses with previous_response_id: a string input becomes an item list', async (t) => {
  const client = h.openai(await h.token());
  const first = await client.responses.create(
    { model: 'gpt-4o', input: 'Clean up.' },
    { headers: script([{ name: 'delete_file', input: { path: '/' } }]) },
  );
  t.same(
    first.output.map((i) => i.type),
    ['message', 'message'],
    'the refused call became a message item',
  );
  const next = await client.responses.create(
    { model: 'gpt-4o', previous_response_id: first.id, input: 'Why not?' },
    { headers: script([{ name: 'delete_file', input: { path: '/' } }]) },
  );
  t.equal(next.output_text, 'On it.');
  t.match(h.upstream.received.at(-1)!.body!.input, [
    { type: 'function_call_output', call_id: 'call_1', output: DENIAL },
    { type: 'message', role: 'user', content: 'Why not?' },
  ]);
  // `store: false`: the provider keeps nothing; a later continuation of it is the provider's 400.
  const unstored = await client.responses.create(
    { model: 'gpt-4o', input: 'Clean up.', store: false },
    { headers: script([{ name: 'delete_file', input: { path: '/' } }]) },
  );
  const after = await post(
    h,
    '/v1/responses',
    JSON.stringify({ model: 'gpt-4o', previous_response_id: unstored.id, input: 'go' }),
  );
  t.equal(after.status, 400);
  t.match(JSON.parse(after.text), { error: { code: 'previous_response_not_found' } });
  t.equal(
    h.upstream.received.at(-1)!.body!.input,
    'go',
    'nothing was remembered for an answer the provider does not keep',
  );
});

t.test('the memory is bounded: a continuation of an evicted answer reaches the provider as sent', async (t) => {
  const small: Harness = await startHarness({ snapshot, refusalMemory: { maxAnswers: 2 } });
  t.teardown(() => small.close());
  const turn = async (body: unknown) =>
    post(small, '/v1/responses', JSON.stringify(body), script([{ name: 'delete_file', input: { path: '/' } }]));
  const answers: string[] = [];
  for (let i = 0; i < 3; i++) answers.push(JSON.parse((await turn({ model: 'gpt-4o', input: 'Clean up.' })).text).id);
  // The oldest of three is gone (two remembered at most): the provider's own error reaches the agent.
  const evicted = await turn({ model: 'gpt-4o', previous_response_id: answers[0], input: [] });
  t.equal(evicted.status, 400);
  t.match(JSON.parse(evicted.text), {
    error: { message: 'No tool output found for function call call_1.', type: 'invalid_request_error' },
  });
  t.same(small.upstream.received.at(-1)!.body!.input, [], 'forwarded as sent');
  for (const id of answers.slice(1)) {
    const kept = await turn({ model: 'gpt-4o', previous_response_id: id, input: [] });
    t.equal(kept.status, 200, `${id} is still remembered`);
  }
});

t.test('the results must fit the 32 MB bound of a body', async (t) => {
  const client = h.openai(await h.token());
  const first = await client.responses.create(
    { model: 'gpt-4o', input: 'Clean up.' },
    { headers: script([{ name: 'delete_file', input: { path: '/' } }]) },
  );
  const head = `{"model":"gpt-4o","previous_response_id":${JSON.stringify(first.id)},"input":"`;
  const body = `${head}${'a'.repeat(32 * 1024 * 1024 - head.length - 2)}"}`;
  t.equal(Buffer.byteLength(body), 32 * 1024 * 1024, 'a body at the bound');
  const before = h.upstream.received.length;
  const res = await post(h, '/v1/responses', body);
  t.equal(res.status, 413, 'past it with the results added: refused, not cut');
  t.equal(h.upstream.received.length, before, 'nothing reached the provider');
});
