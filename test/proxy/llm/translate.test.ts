import t from 'tap';
import type Anthropic from '@anthropic-ai/sdk';
import type OpenAI from 'openai';
import { REPLY, TOOL } from '../../fixtures/llm-upstream.ts';
import { startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';
import { WIRE_FORMATS, type WireFormat } from '../../../pipeline/policy/snapshot.ts';

// --translate: each official SDK, in its own wire format, against an upstream speaking each of the
// others; plain and streamed; text and tool calls; and a conversation that carries tool results.

const TOOLS_ANTHROPIC = [
  {
    name: TOOL.name,
    description: 'weather by city',
    input_schema: { type: 'object' as const, properties: { city: { type: 'string' } }, required: ['city'] },
  },
];
const TOOLS_CHAT = [
  {
    type: 'function' as const,
    function: {
      name: TOOL.name,
      description: 'weather by city',
      parameters: { type: 'object', properties: { city: { type: 'string' } } },
    },
  },
];
const TOOLS_RESPONSES = [
  {
    type: 'function' as const,
    name: TOOL.name,
    description: 'weather by city',
    parameters: { type: 'object', properties: { city: { type: 'string' } } },
    strict: false,
  },
];
const tool = { headers: { 'x-test-behavior': 'tool' } };

interface Outcome {
  text: string;
  streamed: string;
  toolArgs: unknown;
  streamedToolArgs: unknown;
}

async function asAnthropic(client: Anthropic): Promise<Outcome> {
  const model = 'claude-sonnet-4-5';
  const plain = await client.messages.create({
    model,
    max_tokens: 64,
    system: 'Be brief.',
    messages: [{ role: 'user', content: 'hi' }],
  });
  let streamed = '';
  const s = client.messages.stream({ model, max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] });
  s.on('text', (d) => (streamed += d));
  await s.finalMessage();
  const call = await client.messages.create(
    { model, max_tokens: 64, tools: TOOLS_ANTHROPIC, messages: [{ role: 'user', content: 'weather?' }] },
    tool,
  );
  const ts = client.messages.stream(
    { model, max_tokens: 64, tools: TOOLS_ANTHROPIC, messages: [{ role: 'user', content: 'weather?' }] },
    tool,
  );
  const final = await ts.finalMessage();
  const use = (m: Anthropic.Message) =>
    m.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock | undefined;
  if (call.stop_reason !== 'tool_use') throw new Error(`stop_reason ${call.stop_reason}`);
  return {
    text: (plain.content[0] as Anthropic.TextBlock).text,
    streamed,
    toolArgs: use(call)?.input,
    streamedToolArgs: use(final)?.input,
  };
}

async function asChat(client: OpenAI): Promise<Outcome> {
  const model = 'gpt-4o';
  const plain = await client.chat.completions.create({
    model,
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'hi' },
    ],
  });
  let streamed = '';
  for await (const c of await client.chat.completions.create({
    model,
    stream: true,
    messages: [{ role: 'user', content: 'hi' }],
  }))
    streamed += c.choices[0]?.delta?.content ?? '';
  const call = await client.chat.completions.create(
    { model, tools: TOOLS_CHAT, messages: [{ role: 'user', content: 'weather?' }] },
    tool,
  );
  if (call.choices[0].finish_reason !== 'tool_calls') throw new Error(`finish_reason ${call.choices[0].finish_reason}`);
  let args = '';
  let name = '';
  for await (const c of await client.chat.completions.create(
    { model, stream: true, tools: TOOLS_CHAT, messages: [{ role: 'user', content: 'weather?' }] },
    tool,
  )) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      name ||= d.function?.name ?? '';
      args += d.function?.arguments ?? '';
    }
  }
  const fn = (call.choices[0].message.tool_calls![0] as { function: { name: string; arguments: string } }).function;
  if (fn.name !== TOOL.name || name !== TOOL.name) throw new Error('tool name lost');
  return {
    text: plain.choices[0].message.content ?? '',
    streamed,
    toolArgs: JSON.parse(fn.arguments),
    streamedToolArgs: JSON.parse(args),
  };
}

async function asResponses(client: OpenAI): Promise<Outcome> {
  const model = 'gpt-4o';
  const plain = await client.responses.create({ model, instructions: 'Be brief.', input: 'hi' });
  let streamed = '';
  for await (const e of await client.responses.create({ model, input: 'hi', stream: true }))
    if (e.type === 'response.output_text.delta') streamed += e.delta;
  const call = await client.responses.create({ model, tools: TOOLS_RESPONSES, input: 'weather?' }, tool);
  const fc = call.output.find((o) => o.type === 'function_call') as { name: string; arguments: string } | undefined;
  let args = '';
  for await (const e of await client.responses.create(
    { model, stream: true, tools: TOOLS_RESPONSES, input: 'weather?' },
    tool,
  )) {
    if (e.type === 'response.function_call_arguments.delta') args += e.delta;
  }
  if (fc?.name !== TOOL.name) throw new Error('tool name lost');
  return { text: plain.output_text, streamed, toolArgs: JSON.parse(fc.arguments), streamedToolArgs: JSON.parse(args) };
}

async function drive(h: Harness, agent: WireFormat, token: string): Promise<Outcome> {
  if (agent === 'anthropic-messages') return asAnthropic(h.anthropic(token));
  return agent === 'openai-chat' ? asChat(h.openai(token)) : asResponses(h.openai(token));
}

const ROUTE: Record<WireFormat, string> = {
  'anthropic-messages': '/v1/messages',
  'openai-chat': '/v1/chat/completions',
  'openai-responses': '/v1/responses',
};

for (const upstream of WIRE_FORMATS) {
  t.test(`upstream speaks ${upstream}`, async (t) => {
    const h = await startHarness({ proxy: { translate: true, translateUpstreamFormat: upstream } });
    t.teardown(() => h.close());
    for (const agent of WIRE_FORMATS) {
      const before = h.upstream.received.length;
      const out = await drive(h, agent, await h.token());
      t.same(
        out,
        { text: REPLY, streamed: REPLY, toolArgs: TOOL.input, streamedToolArgs: TOOL.input },
        `${agent} agent`,
      );
      const sent = h.upstream.received.slice(before);
      t.ok(
        sent.every((r) => r.path === ROUTE[upstream]),
        `${agent} → every call reached ${ROUTE[upstream]}`,
      );
      if (agent !== upstream) {
        t.match(h.audit.at(-1), { format: agent, upstream_format: upstream });
        const first = sent[0].body!;
        const prefixed = JSON.stringify(
          upstream === 'anthropic-messages'
            ? first.system
            : upstream === 'openai-chat'
              ? (first.messages as { role: string }[]).filter((m) => m.role === 'system')
              : first.instructions,
        );
        t.match(prefixed, /\[dvx security context\]/, `${agent} → the prefix sits in the ${upstream} system prompt`);
        t.match(prefixed, /Be brief\./, "and the agent's own system prompt follows it");
      } else {
        t.equal(h.audit.at(-1)!.upstream_format, null, 'same format: not translated');
      }
    }
  });
}

t.test('a conversation with tool calls and results translates both ways', async (t) => {
  const h = await startHarness({ proxy: { translate: true, translateUpstreamFormat: 'openai-chat' } });
  t.teardown(() => h.close());
  const client = h.anthropic(await h.token());
  await client.messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    tools: TOOLS_ANTHROPIC,
    messages: [
      { role: 'user', content: 'weather in Paris?' },
      {
        role: 'assistant',
        content: [
          { type: 'text', text: 'Checking.' },
          { type: 'tool_use', id: 'toolu_9', name: TOOL.name, input: { city: 'Paris' } },
        ],
      },
      {
        role: 'user',
        content: [
          { type: 'tool_result', tool_use_id: 'toolu_9', content: '18°C' },
          { type: 'text', text: 'and tomorrow?' },
        ],
      },
    ],
  });
  const sent = h.upstream.received.at(-1)!.body as { messages: Record<string, unknown>[]; tools: unknown[] };
  t.match(sent.messages.slice(1), [
    { role: 'user', content: 'weather in Paris?' },
    {
      role: 'assistant',
      content: 'Checking.',
      tool_calls: [{ id: 'toolu_9', type: 'function', function: { name: TOOL.name, arguments: '{"city":"Paris"}' } }],
    },
    { role: 'tool', tool_call_id: 'toolu_9', content: '18°C' },
    { role: 'user', content: 'and tomorrow?' },
  ]);
  t.match(sent.tools, [{ type: 'function', function: { name: TOOL.name, parameters: { type: 'object' } } }]);
});

t.test('untranslatable input is a 400, never a half-translated call', async (t) => {
  const h = await startHarness({ proxy: { translate: true, translateUpstreamFormat: 'anthropic-messages' } });
  t.teardown(() => h.close());
  const before = h.upstream.received.length;
  const r = await h.call('/v1/chat/completions', {
    headers: { 'content-type': 'application/json', authorization: `Bearer ${await h.token()}` },
    body: JSON.stringify({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }] }],
    }),
  });
  t.equal(r.status, 400);
  t.match(JSON.parse(r.text), { error: { type: 'invalid_request_error', message: /input_audio/ } });
  t.equal(h.upstream.received.length, before);
});
