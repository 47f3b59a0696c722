import t from 'tap';
import {
  aJson,
  aStart,
  aStop,
  anthropicCalls,
  ev,
  msgEnd,
  msgStart,
  onlyAllowed,
  smugglingServer,
  toolUse,
} from './smuggling-fixture.ts';

// Anthropic streams whose block indexes say something else than where the SDK puts the blocks: the
// SDK places each started block at the next position (whatever its `index`), and applies a delta to
// the block at the delta's index, `"0"` as much as `0`. The gate must read the blocks where the SDK
// does, or a call goes unexamined, or runs with arguments other than the ones decided.

const s = await smugglingServer();
t.teardown(() => s.close());

t.test('a tool_use block started without an index', async (t) => {
  s.decided = [];
  s.body = msgStart + aStart(undefined, toolUse('toolu_9', 'delete_files', { path: '/' })) + aStop(undefined) + msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
});

t.test('an argument delta under the index spelled as a string', async (t) => {
  s.decided = [];
  s.body =
    msgStart +
    aStart(0, toolUse('toolu_1', 'pay')) +
    aJson(0, '{"amount": 1') +
    aJson('0', '00000') +
    aJson(0, '}') +
    aStop(0) +
    msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
});

t.test('a text block whose index is not its position moves the call under it', async (t) => {
  s.decided = [];
  s.body =
    msgStart +
    aStart(5, { type: 'text', text: '' }) +
    aStart(0, toolUse('toolu_1', 'pay')) +
    aJson(0, '{"amount": 1}') +
    aJson(1, '{"amount": 1000000}') +
    aStop(0) +
    aStop(1) +
    msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
});

t.test('message_start content takes the first positions', async (t) => {
  s.decided = [];
  const start = msgStart.replace('"content":[]', '"content":[{"type":"text","text":"hi"}]');
  s.body =
    start +
    aStart(0, toolUse('toolu_1', 'pay')) +
    aJson(0, '{"amount": 1}') +
    aJson(1, '{"amount": 1000000}') +
    aStop(0) +
    aStop(1) +
    msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
});

t.test('empty deltas over a start that carries its input', async (t) => {
  s.decided = [];
  s.body = msgStart + aStart(0, toolUse('toolu_1', 'pay', { amount: 1000000 })) + aJson(0, '') + aStop(0) + msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
  t.ok(
    s.decided.every((d) => d.call.arguments !== ''),
    'no call decided on an empty text while the SDK runs the start input',
  );
});

t.test('the API way: a call without arguments streams one empty delta, decided as {}', async (t) => {
  s.decided = [];
  s.body = msgStart + aStart(0, toolUse('toolu_1', 'get_time')) + aJson(0, '') + aStop(0) + msgEnd;
  const calls = await anthropicCalls(s);
  onlyAllowed(t, s, calls);
  t.same(
    s.decided.map((d) => d.call.arguments),
    ['{}'],
  );
  t.same(calls, [{ id: 'toolu_1', name: 'get_time', args: {} }]);
});

t.test('well-formed streams are untouched, other blocks around calls included', async (t) => {
  s.decided = [];
  const text = ev('content_block_delta', {
    type: 'content_block_delta',
    index: 0,
    delta: { type: 'text_delta', text: 'ok' },
  });
  s.body =
    msgStart +
    aStart(0, { type: 'text', text: '' }) +
    text +
    aStop(0) +
    aStart(1, toolUse('toolu_1', 'pay')) +
    aJson(1, '{"amount": 5}') +
    aStop(1) +
    msgEnd;
  const calls = await anthropicCalls(s);
  onlyAllowed(t, s, calls);
  t.same(calls, [{ id: 'toolu_1', name: 'pay', args: { amount: 5 } }]);
});
