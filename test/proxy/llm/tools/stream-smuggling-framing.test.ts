import t from 'tap';
import {
  BOM,
  aStart,
  aStop,
  anthropicCalls,
  chatCalls,
  chatChunk,
  ev,
  msgEnd,
  msgStart,
  onlyAllowed,
  smugglingServer,
  toolCall,
  toolUse,
} from './smuggling-fixture.ts';

// SSE framing the official SDKs read more loosely than the spec: the gate must see every event they
// see. Both SDKs decode each line on its own and drop a byte-order mark opening ANY line (the spec:
// only the stream's first), so `<BOM>data: …` is data to them and a line of only a BOM ends an event.

const s = await smugglingServer();
t.teardown(() => s.close());

const head = { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm' };
const deleteChunk = JSON.stringify({
  ...head,
  choices: [{ index: 0, delta: toolCall(0, { name: 'delete_files', arguments: '{"path":"/"}' }, 'call_9') }],
});
const finish = chatChunk({ index: 0, delta: {}, finish_reason: 'tool_calls' }) + ev(null, '[DONE]');

t.test('chat: a data line opened with a byte-order mark', async (t) => {
  s.decided = [];
  s.body =
    chatChunk({ index: 0, delta: { role: 'assistant', content: 'ok' } }) + `${BOM}data: ${deleteChunk}\n\n` + finish;
  onlyAllowed(t, s, await chatCalls(s));
  t.ok(
    s.decided.some((d) => d.call.name === 'delete_files' && !d.verdict.allow),
    'the gate saw the call and refused it',
  );
});

t.test('chat: a line of only a byte-order mark ends an event, as for the SDKs', async (t) => {
  s.decided = [];
  const ok = JSON.stringify({ ...head, choices: [{ index: 0, delta: { role: 'assistant', content: 'ok' } }] });
  s.body = `data: ${ok}\n${BOM}\ndata: ${deleteChunk}\n\n${finish}`;
  onlyAllowed(t, s, await chatCalls(s));
  t.ok(s.decided.some((d) => d.call.name === 'delete_files' && !d.verdict.allow));
});

t.test('anthropic: event and data lines opened with a byte-order mark mid-stream', async (t) => {
  s.decided = [];
  s.body =
    msgStart +
    aStart(0, { type: 'text', text: '' }) +
    aStop(0) +
    `${BOM}event: content_block_start\n${BOM}data: ${JSON.stringify({
      type: 'content_block_start',
      index: 1,
      content_block: toolUse('toolu_9', 'delete_files', { path: '/' }),
    })}\n\n` +
    aStop(1) +
    msgEnd;
  onlyAllowed(t, s, await anthropicCalls(s));
  t.ok(s.decided.some((d) => d.call.name === 'delete_files' && !d.verdict.allow));
});
