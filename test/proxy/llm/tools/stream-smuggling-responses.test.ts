import t from 'tap';
import {
  functionCall,
  messageItem,
  onlyAllowed,
  response,
  responsesCalls,
  responsesEvents,
  smugglingServer,
} from './smuggling-fixture.ts';

// OpenAI Responses streams that carry a call item where the gate did not look for one: the SDK pushes
// each added item at the next position of `output` (whatever its output_index) and replaces the item
// at an event's output_index with an `output_item.done` item; apps run calls from the final response
// and from `response.output_item.done` events. A stream without `response.completed` (cut, or an odd
// upstream) leaves the SDK's own snapshot as the final response.

const s = await smugglingServer();
t.teardown(() => s.close());

t.test('a function_call item done where a message was added', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: messageItem }) +
    e('response.output_item.done', { output_index: 0, item: functionCall(9, 'delete_files', '{"path":"/"}') });
  onlyAllowed(t, s, await responsesCalls(s));
});

t.test('a function_call item added without an output_index', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { item: functionCall(9, 'delete_files', '{"path":"/"}') });
  onlyAllowed(t, s, await responsesCalls(s));
});

t.test('a second call item added under the index of the first', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: functionCall(1, 'pay', '', 'in_progress') }) +
    e('response.output_item.added', { output_index: 0, item: functionCall(9, 'delete_files', '{"path":"/"}') }) +
    e('response.output_item.done', { output_index: 0, item: functionCall(1, 'pay', '{"amount": 5}') });
  onlyAllowed(t, s, await responsesCalls(s));
});

t.test('an item done with another type than it was added with', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  const custom = {
    id: 'fc_1',
    type: 'custom_tool_call',
    status: 'in_progress',
    call_id: 'call_1',
    name: 'pay',
    input: '',
  };
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: custom }) +
    e('response.custom_tool_call_input.delta', { item_id: 'fc_1', output_index: 0, delta: '{"amount": 1}' }) +
    e('response.output_item.done', {
      output_index: 0,
      item: { ...functionCall(1, 'pay', '{"amount": 1000000}'), input: '{"amount": 1}' },
    });
  onlyAllowed(t, s, await responsesCalls(s));
});

t.test('a done under the output_index spelled as a string', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: functionCall(1, 'pay', '', 'in_progress') }) +
    e('response.output_item.done', { output_index: 0, item: functionCall(1, 'pay', '{"amount": 5}') }) +
    e('response.output_item.done', { output_index: '0', item: functionCall(1, 'pay', '{"amount": 5000}') });
  onlyAllowed(t, s, await responsesCalls(s));
});

t.test('the API way is untouched: a call decided and delivered', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  const done = functionCall(1, 'pay', '{"amount": 5}');
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: functionCall(1, 'pay', '', 'in_progress') }) +
    e('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: '{"amount": 5}' }) +
    e('response.output_item.done', { output_index: 0, item: done }) +
    e('response.completed', { response: response('completed', [done]) });
  const calls = await responsesCalls(s);
  onlyAllowed(t, s, calls);
  t.equal(calls.length, 2, 'in the final response and in its done event');
});

t.test('a built-in tool the agent runs (local shell) is decided as a call, and refused', async (t) => {
  s.decided = [];
  const e = responsesEvents();
  const shell = (status: string) => ({
    type: 'local_shell_call',
    id: 'ls_1',
    call_id: 'call_ls',
    status,
    action: { type: 'exec', command: ['rm', '-rf', '/'], env: {} },
  });
  s.body =
    e('response.created', { response: response('in_progress', []) }) +
    e('response.output_item.added', { output_index: 0, item: shell('in_progress') }) +
    e('response.output_item.done', { output_index: 0, item: shell('completed') }) +
    e('response.completed', { response: response('completed', [shell('completed')]) });
  const stream = s.openai.responses.stream({ model: 'm', input: 'hi' });
  const done: string[] = [];
  stream.on('response.output_item.done', (ev) => done.push(ev.item.type));
  const r = await stream.finalResponse();
  t.same(
    s.decided.map((d) => [d.call.name, d.call.arguments, d.verdict.allow]),
    [['local_shell', JSON.stringify(shell('completed').action), false]],
  );
  t.same(
    r.output.map((o) => o.type),
    ['message'],
    'the final response holds the denial',
  );
  t.same(done, ['message'], 'and so does the done event');
});
