import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import t from 'tap';
import type { WireFormat } from '../../../../pipeline/policy/snapshot.ts';
import { streamToolGate } from '../../../../proxy/llm/tools/stream-formats.ts';
import type { Decide } from '../../../../proxy/llm/tools/types.ts';
import { DELETE_ARGS, STREAMS, WEATHER_ARGS } from './stream-fixtures.ts';

// The gate's rewritten streams read by the official SDKs' stream parsers: a node:http server plays the
// provider, its answer going through the tool gate live (in small pieces, decisions arriving late so
// keep-alives are interleaved), and each SDK's accumulated final answer is checked.

const PATHS: Record<string, WireFormat> = {
  '/v1/messages': 'anthropic-messages',
  '/v1/chat/completions': 'openai-chat',
  '/v1/responses': 'openai-responses',
};

let decide: Decide = async () => ({ allow: true, message: '' });
let keepAlives = 0;

const server = http.createServer(async (req, res) => {
  for await (const _ of req);
  const format = PATHS[req.url ?? ''];
  const bytes = Buffer.from(STREAMS[format]());
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  const gate = streamToolGate(format, decide, { keepAliveMs: 5 });
  const writing = (async () => {
    for (let b = await gate.next(); b !== null; b = await gate.next()) {
      if (b.includes(': keep-alive') || b.includes('event: ping')) keepAlives++;
      res.write(b);
    }
    res.end();
  })();
  for (let i = 0; i < bytes.length; i += 37) {
    gate.push(bytes.subarray(i, i + 37));
    await sleep(0);
  }
  gate.end();
  await writing;
});
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
t.teardown(() => new Promise<void>((r) => server.close(() => r())));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

/** Decides like denyDeletes, after `ms`. */
const lateDecide =
  (ms: number, refuse: (name: string) => boolean): Decide =>
  async (call) => {
    await sleep(ms);
    return refuse(call.name) ? { allow: false, message: message(call.name, call.id) } : { allow: true, message: '' };
  };
const message = (name: string, id: string) => `[dvx] The tool call ${name} (id ${id}) was not run: denied by rule.`;

const anthropic = new Anthropic({ apiKey: 'k', baseURL: base, maxRetries: 0 });
const openai = new OpenAI({ apiKey: 'k', baseURL: `${base}/v1`, maxRetries: 0 });
const TOOLS = [
  { type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object' } } },
  { type: 'function' as const, function: { name: 'delete_files', parameters: { type: 'object' } } },
];

t.test('Anthropic SDK: messages.stream().finalMessage()', async (t) => {
  const run = () =>
    anthropic.messages
      .stream({ model: 'claude-test', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] })
      .finalMessage();
  decide = lateDecide(30, (n) => n === 'delete_files');
  keepAlives = 0;
  let m = await run();
  t.ok(keepAlives > 0, 'pings went out while held');
  t.same(m.content, [
    { type: 'text', text: 'Checking.' },
    { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: JSON.parse(WEATHER_ARGS) },
    { type: 'text', text: message('delete_files', 'toolu_2') },
  ]);
  t.equal(m.stop_reason, 'tool_use', 'an allowed call remains');
  t.equal(m.usage.output_tokens, 30, 'usage intact');

  decide = lateDecide(10, () => true);
  m = await run();
  t.same(
    m.content.map((b) => b.type),
    ['text', 'text', 'text'],
  );
  t.equal(m.stop_reason, 'end_turn', 'no allowed call: the turn ends');

  decide = async () => ({ allow: true, message: '' });
  m = await run();
  t.same(m.content[2], { type: 'tool_use', id: 'toolu_2', name: 'delete_files', input: JSON.parse(DELETE_ARGS) });
});

t.test('OpenAI SDK: chat.completions.stream().finalChatCompletion()', async (t) => {
  const run = () =>
    openai.chat.completions
      .stream({ model: 'gpt-test', messages: [{ role: 'user', content: 'hi' }], tools: TOOLS })
      .finalChatCompletion();
  decide = lateDecide(30, (n) => n === 'get_weather');
  keepAlives = 0;
  let c = await run();
  t.ok(keepAlives > 0, 'keep-alive comments went out while held');
  const msg = c.choices[0].message;
  t.equal(msg.content, `Checking.\n\n${message('get_weather', 'call_1')}`);
  t.same(
    msg.tool_calls?.map((tc) => tc.type === 'function' && [tc.id, tc.function.name, tc.function.arguments]),
    [['call_2', 'delete_files', DELETE_ARGS]],
    'the refused call is gone, the other re-indexed from 0',
  );
  t.equal(c.choices[0].finish_reason, 'tool_calls');
  t.same(c.usage, { prompt_tokens: 20, completion_tokens: 30, total_tokens: 50 });

  decide = lateDecide(10, () => true);
  c = await run();
  t.notOk(c.choices[0].message.tool_calls?.length, 'no call left');
  t.equal(c.choices[0].finish_reason, 'stop');
  t.equal(
    c.choices[0].message.content,
    `Checking.\n\n${message('get_weather', 'call_1')}\n\n${message('delete_files', 'call_2')}`,
  );
});

t.test('OpenAI SDK: responses.stream().finalResponse()', async (t) => {
  const run = () => openai.responses.stream({ model: 'gpt-test', input: 'hi' }).finalResponse();
  decide = lateDecide(30, (n) => n === 'delete_files');
  keepAlives = 0;
  const events: number[] = [];
  const stream = openai.responses.stream({ model: 'gpt-test', input: 'hi' });
  stream.on('event', (e) => events.push(e.sequence_number));
  let r = await stream.finalResponse();
  t.ok(keepAlives > 0, 'keep-alive comments went out while held');
  t.same(
    events,
    events.map((_, i) => i),
    'sequence numbers without gaps',
  );
  t.same(
    r.output.map((o) => [o.type, o.id]),
    [
      ['message', 'msg_1'],
      ['function_call', 'fc_1'],
      ['message', 'msg_dvx_fc_2'],
    ],
  );
  const denial = r.output[2];
  t.match(denial, {
    type: 'message',
    role: 'assistant',
    status: 'completed',
    content: [{ type: 'output_text', text: message('delete_files', 'call_2'), annotations: [] }],
  });
  t.equal(denial.type === 'message' && denial.content.length, 1);
  t.equal(r.output_text, `Checking.${message('delete_files', 'call_2')}`);
  t.same(r.usage, { input_tokens: 20, output_tokens: 30, total_tokens: 50 });

  decide = lateDecide(10, () => true);
  r = await run();
  t.same(
    r.output.map((o) => o.type),
    ['message', 'message', 'message'],
  );
});
