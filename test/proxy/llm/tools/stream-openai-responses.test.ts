import t from 'tap';
import type { Decide } from '../../../../proxy/llm/tools/types.ts';
import { denyDeletes, eventsOf, responsesStream, through } from './stream-fixtures.ts';

// Responses streams through the tool gate: a refused function_call item becomes a message item at its
// output_index, in the events and in the response objects, sequence numbers kept gapless.

type Obj = Record<string, any>;
const F = 'openai-responses';
const allow: Decide = async () => ({ allow: true, message: '' });
const data = (out: Buffer) => eventsOf(out).map((e) => e.data as Obj);

t.test('a refused item: a message item at its output_index, events renumbered without gaps', async (t) => {
  const { out } = await through(F, [Buffer.from(responsesStream())], denyDeletes);
  const events = data(out);
  t.same(
    events.map((e) => e.sequence_number),
    events.map((_, i) => i),
  );
  t.same(
    events.filter((e) => e.output_index === 2).map((e) => e.type),
    [
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
    ],
  );
  t.same(events.filter((e) => e.output_index === 2).at(-1)!.item, {
    id: 'msg_dvx_fc_2',
    type: 'message',
    status: 'completed',
    role: 'assistant',
    content: [
      {
        type: 'output_text',
        text: '[dvx] The tool call delete_files (id call_2) was not run: denied by rule.',
        annotations: [],
      },
    ],
  });
  const completed = events.at(-1)!;
  t.same(
    completed.response.output.map((o: Obj) => o.id),
    ['msg_1', 'fc_1', 'msg_dvx_fc_2'],
    'the final response says the same',
  );
  t.same(completed.response.usage, { input_tokens: 20, output_tokens: 30, total_tokens: 50 });
});

t.test('the final response may not smuggle or change a call', async (t) => {
  const stream = responsesStream()
    .replace(
      '"arguments":"{\\"city\\":\\"Paris\\"}"},{"id":"fc_2"',
      '"arguments":"{\\"city\\":\\"Rome\\"}"},{"id":"fc_2"',
    )
    .replace(
      /("response":\{[^\n]*"output":\[)([^\n]*"status":"completed")/,
      '$1{"id":"fc_9","type":"function_call","status":"completed","call_id":"call_9","name":"rm","arguments":"{}"},$2',
    );
  t.not(stream, responsesStream(), 'the fixture was altered');
  const { out, gate } = await through(F, [Buffer.from(stream)], allow);
  const completed = data(out).at(-1)!;
  t.same(
    completed.response.output.map((o: Obj) => o.type),
    ['message', 'message', 'message', 'function_call'],
  );
  t.match(completed.response.output[0].content[0].text, /rm \(id call_9\) was not run: it was not streamed/);
  t.match(completed.response.output[2].content[0].text, /get_weather \(id call_1\) was not run: the final response/);
  t.same(completed.response.output[3].call_id, 'call_2');
  t.same(
    gate.calls.map((c) => c.state),
    ['allowed', 'allowed', 'refused', 'refused'],
  );
});

t.test('arguments streamed inconsistently are refused without a decision', async (t) => {
  const stream = responsesStream().replace(
    '"type":"response.function_call_arguments.done","sequence_number":11,"item_id":"fc_1","output_index":1,"arguments":"{\\"city\\":\\"Paris\\"}"',
    '"type":"response.function_call_arguments.done","sequence_number":11,"item_id":"fc_1","output_index":1,"arguments":"{\\"city\\":\\"Oslo\\"}"',
  );
  t.not(stream, responsesStream());
  const decided: string[] = [];
  const { out } = await through(F, [Buffer.from(stream)], async (c) => {
    decided.push(c.name);
    return { allow: true, message: '' };
  });
  t.same(decided, ['delete_files']);
  t.match(out.toString(), /get_weather \(id call_1\) was not run: its arguments were not streamed consistently/);
  t.notMatch(out.toString(), /Oslo/);
});

t.test('argument events for a call already whole never reach the agent', async (t) => {
  const stream = responsesStream();
  const at = stream.indexOf(
    'event: response.output_item.added',
    stream.indexOf('"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"completed"'),
  );
  const late =
    'event: response.function_call_arguments.delta\ndata: {"type":"response.function_call_arguments.delta","sequence_number":99,"item_id":"fc_1","output_index":1,"delta":"junk"}\n\n';
  let n = 0; // the upstream numbers the late event like any other
  const input = (stream.slice(0, at) + late + stream.slice(at)).replace(
    /"sequence_number":\d+/g,
    () => `"sequence_number":${n++}`,
  );
  const { out } = await through(F, [Buffer.from(input)], allow);
  t.notMatch(out.toString(), /junk/);
  const seqs = data(out).map((e) => e.sequence_number);
  t.same(
    seqs,
    seqs.map((_, i) => i),
    'numbering closes the gap',
  );
});

t.test('a custom_tool_call is decided on its input and refused like a function call', async (t) => {
  const stream = responsesStream()
    .replaceAll('"type":"function_call"', '"type":"custom_tool_call"')
    .replaceAll('response.function_call_arguments.', 'response.custom_tool_call_input.')
    .replace(/("type":"response\.custom_tool_call_input\.done"[^\n]*?)"arguments":/g, '$1"input":')
    .replace(/("type":"custom_tool_call"[^}]*?)"arguments":/g, '$1"input":');
  t.notMatch(stream, /"arguments"/, 'every function call turned custom');
  const decided: string[] = [];
  const { out } = await through(F, [Buffer.from(stream)], async (c) => {
    decided.push(`${c.name}:${c.arguments}`);
    return verdict(c.name);
  });
  t.same(decided, ['get_weather:{"city":"Paris"}', 'delete_files:{"path":"/"}']);
  const completed = data(out).at(-1)!;
  t.same(
    completed.response.output.map((o: Obj) => `${o.type}:${o.id}`),
    ['message:msg_1', 'custom_tool_call:fc_1', 'message:msg_dvx_fc_2'],
  );
});

t.test('the gate words its own refusals by --inspection-disclosure', async (t) => {
  const stream = responsesStream().replace(
    /("response\.completed".*"output":\[)/,
    '$1{"id":"fc_9","type":"function_call","status":"completed","call_id":"call_9","name":"rm","arguments":"{}"},',
  );
  const { out } = await through(F, [Buffer.from(stream)], allow, { disclosure: 'opaque' });
  const completed = data(out).at(-1)!;
  t.equal(
    completed.response.output[0].content[0].text,
    '[dvx] The tool call rm (id call_9) was not run: refused by policy.',
  );
});

function verdict(name: string) {
  return name === 'delete_files' ? { allow: false, message: `no ${name}` } : { allow: true, message: '' };
}
