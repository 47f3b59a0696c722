import t from 'tap';
import type { Decide } from '../../../../proxy/llm/tools/types.ts';
import { anthropicStream, denyDeletes, eventsOf, through } from './stream-fixtures.ts';

// Anthropic streams through the tool gate: a refused tool_use block becomes a text block at its index.

type Obj = Record<string, any>;
const F = 'anthropic-messages';
const refuseAll: Decide = async (c) => ({ allow: false, message: `no ${c.name}` });
const data = (out: Buffer) => eventsOf(out).map((e) => e.data as Obj);

t.test('a refused block: text at the same index, its deltas gone, its stop kept', async (t) => {
  const { out } = await through(F, [Buffer.from(anthropicStream())], denyDeletes);
  const ev = data(out).filter((e) => e.index === 2);
  t.same(ev, [
    { type: 'content_block_start', index: 2, content_block: { type: 'text', text: '' } },
    {
      type: 'content_block_delta',
      index: 2,
      delta: { type: 'text_delta', text: '[dvx] The tool call delete_files (id toolu_2) was not run: denied by rule.' },
    },
    { type: 'content_block_stop', index: 2 },
  ]);
  const stop = data(out).find((e) => e.type === 'message_delta')!;
  t.equal(stop.delta.stop_reason, 'tool_use', 'an allowed call remains');
  t.same(stop.usage, { output_tokens: 30 }, 'usage intact');
});

t.test('every call refused: stop_reason end_turn, nothing else changed', async (t) => {
  const input = Buffer.from(anthropicStream());
  const { out } = await through(F, [input], refuseAll);
  const events = eventsOf(out);
  t.same(
    events.filter((e) => (e.data as Obj).type === 'content_block_start').map((e) => (e.data as Obj).content_block.type),
    ['text', 'text', 'text'],
  );
  const delta = events.find((e) => e.event === 'message_delta')!;
  t.same(delta.data, {
    type: 'message_delta',
    delta: { stop_reason: 'end_turn', stop_sequence: null },
    usage: { output_tokens: 30 },
  });
  t.ok(out.toString().startsWith(input.toString().slice(0, input.indexOf('event: content_block_start', 400))));
});

t.test('a tool_use block without deltas is decided on its input; pings and errors pass', async (t) => {
  const stream =
    'event: ping\ndata: {"type": "ping"}\n\n' +
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"noop","input":{}}}\n\n' +
    'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n' +
    'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n';
  const seen: string[] = [];
  const { out } = await through(F, [Buffer.from(stream)], async (c) => {
    seen.push(c.arguments);
    return { allow: true, message: '' };
  });
  t.same(seen, ['{}']);
  t.equal(out.toString(), stream);
});

t.test('a second tool_use started under the index of an open one is refused, never decided', async (t) => {
  // The SDKs put it at the next position (1) and apply index 0's deltas and stop to the first one.
  const start = (i: number, id: string) =>
    `event: content_block_start\ndata: {"type":"content_block_start","index":${i},"content_block":{"type":"tool_use","id":"${id}","name":"x","input":{}}}\n\n`;
  const stop = (i: number) => `event: content_block_stop\ndata: {"type":"content_block_stop","index":${i}}\n\n`;
  const seen: string[] = [];
  const { out, gate } = await through(F, [Buffer.from(start(0, 'a') + start(0, 'b') + stop(0))], async (c) => {
    seen.push(c.id);
    return { allow: true, message: '' };
  });
  t.same(seen, ['a']);
  t.same(
    gate.calls.map((c) => c.state),
    ['allowed', 'refused'],
  );
  t.notMatch(out.toString(), /"id":"b"/, 'the second block never reaches the agent as a call');
  t.match(data(out)[1], { type: 'content_block_start', index: 1, content_block: { type: 'text' } });
});

t.test('a tool_use smuggled into message_start’s content is refused, never decided', async (t) => {
  const stream = anthropicStream().replace(
    '"content":[]',
    '"content":[{"type":"tool_use","id":"toolu_x","name":"rm","input":{"path":"/"}}]',
  );
  const decided: string[] = [];
  const { out, gate } = await through(F, [Buffer.from(stream)], async (c) => {
    decided.push(c.name);
    return { allow: true, message: '' };
  });
  // It takes position 0 in the SDKs' message: every streamed block's index is then off by one, so
  // the streamed calls are refused as well (their deltas would reach the SDKs' neighbouring block).
  t.same(decided, []);
  t.same(data(out)[0].message.content, [
    { type: 'text', text: '[dvx] The tool call rm (id toolu_x) was not run: it was not streamed as a content block.' },
  ]);
  t.same(
    gate.calls.map((c) => c.state),
    ['refused', 'refused', 'refused'],
  );
});

t.test('a delta for a tool_use block already stopped never reaches the agent', async (t) => {
  const late =
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":",\\"x\\":1"}}\n\n';
  const stream = anthropicStream();
  const at = stream.indexOf(
    'event: content_block_start',
    stream.indexOf('"index":1,"content_block":{"type":"tool_use"') + 1,
  );
  const { out } = await through(F, [Buffer.from(stream.slice(0, at) + late + stream.slice(at))], denyDeletes);
  t.notMatch(out.toString(), /\\"x\\":1/);
  t.match(out.toString(), /"name":"get_weather"/, 'the call itself is delivered as decided');
});
