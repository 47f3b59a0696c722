import t from 'tap';
import { chatCalls, chatChunk, chatRaw, ev, onlyAllowed, smugglingServer, toolCall } from './smuggling-fixture.ts';

// OpenAI chat streams whose choice index the gate and the SDK would read differently: the SDK keeps
// `choices[index]` with the index as it came (a missing index or "0x0" lands beside the choices),
// where the gate read `Number(index ?? 0)`. Pieces of a call under such a choice joined the gate's
// choice 0 and not the SDK's: the gate decided arguments the agent never ran.

const s = await smugglingServer();
t.teardown(() => s.close());

const finish = chatChunk({ index: 0, delta: {}, finish_reason: 'tool_calls' }) + ev(null, '[DONE]');
/** Pieces that read as {"amount": 1} to whoever joins all three, {"amount": 100000} to whoever skips the middle one. */
const stream = (middle: Record<string, unknown>) =>
  chatChunk({
    index: 0,
    delta: { role: 'assistant', ...toolCall(0, { name: 'pay', arguments: '{"amount": 100000, "n": "' }, 'call_1') },
  }) +
  chatRaw([{ ...middle, delta: { tool_calls: [{ index: 0, function: { arguments: '", "amount": 1, "z": "' } }] } }]) +
  chatChunk({ index: 0, delta: toolCall(0, { arguments: '"}' }) }) +
  finish;

for (const [what, middle] of [
  ['without an index', {}],
  ['with index null', { index: null }],
  ['with index "0x0"', { index: '0x0' }],
  ['with index "0"', { index: '0' }],
  ['with index -1', { index: -1 }],
  ['with index 0.5', { index: 0.5 }],
] as const) {
  t.test(`argument pieces under a choice ${what}`, async (t) => {
    s.decided = [];
    s.body = stream(middle);
    onlyAllowed(t, s, await chatCalls(s));
  });
}

t.test('a text chunk whose choice has no index still reaches the agent, as choice 0', async (t) => {
  s.decided = [];
  s.body =
    chatRaw([{ delta: { role: 'assistant', content: 'hello' } }]) +
    chatChunk({ index: 0, delta: toolCall(0, { name: 'pay', arguments: '{"amount": 5}' }, 'call_1') }) +
    finish;
  const c = await s.openai.chat.completions
    .stream({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })
    .finalChatCompletion();
  t.equal(c.choices[0].message.content, 'hello');
  onlyAllowed(t, s, await chatCalls(s));
});
