import t from 'tap';
import type { Decide } from '../../../../proxy/llm/tools/types.ts';
import { chatStream, eventsOf, through } from './stream-fixtures.ts';

// Chat completion streams through the tool gate: a refused call leaves tool_calls (the rest re-indexed)
// and its message arrives as content; finish_reason says tool_calls only while an allowed call remains.

type Obj = Record<string, any>;
const F = 'openai-chat';
const refuse =
  (...names: string[]): Decide =>
  async (c) =>
    names.includes(c.name) ? { allow: false, message: `no ${c.name}` } : { allow: true, message: '' };
const chunks = (out: Buffer) =>
  eventsOf(out)
    .filter((e) => typeof e.data === 'object')
    .map((e) => e.data as Obj);
const entries = (out: Buffer) => chunks(out).flatMap((c) => c.choices.flatMap((ch: Obj) => ch.delta?.tool_calls ?? []));

t.test(
  'the first call refused: the second becomes index 0, the message is content after a paragraph break',
  async (t) => {
    const { out } = await through(F, [Buffer.from(chatStream())], refuse('get_weather'));
    t.same(
      entries(out).map((e: Obj) => [e.index, e.id ?? null, e.function.arguments]),
      [
        [0, 'call_2', ''],
        [0, null, '{"path":"/"}'],
      ],
    );
    const content = chunks(out)
      .flatMap((c) => c.choices.map((ch: Obj) => ch.delta?.content ?? ''))
      .join('');
    t.equal(content, 'Checking.\n\nno get_weather');
    t.equal(chunks(out).find((c) => c.choices[0]?.finish_reason)!.choices[0].finish_reason, 'tool_calls');
    t.match(out.toString(), /data: \[DONE\]\n\n$/);
    t.same(chunks(out).at(-1)!.usage, { prompt_tokens: 20, completion_tokens: 30, total_tokens: 50 }, 'usage intact');
  },
);

t.test('every call refused: no tool_calls, finish_reason stop, chunks of argument pieces gone', async (t) => {
  const { out } = await through(F, [Buffer.from(chatStream())], refuse('get_weather', 'delete_files'));
  t.same(entries(out), []);
  t.equal(chunks(out).find((c) => c.choices[0]?.finish_reason)!.choices[0].finish_reason, 'stop');
  t.equal(chunks(out).length, 2 + 2 + 1 + 1, 'role, text, two messages, finish, usage');
});

t.test('no content before: the message is the content, no leading break', async (t) => {
  const stream = chatStream().replace(/data: [^\n]*"content":"Checking\."[^\n]*\n\n/, '');
  const { out } = await through(F, [Buffer.from(stream)], refuse('get_weather'));
  const content = chunks(out)
    .flatMap((c) => c.choices.map((ch: Obj) => ch.delta?.content ?? ''))
    .join('');
  t.equal(content, 'no get_weather');
});

const chunk = (choices: Obj[]) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices })}\n\n`;
const tc = (index: number, args: string, id?: string, name?: string) => ({
  index,
  ...(id ? { id, type: 'function' } : {}),
  function: { ...(name ? { name } : {}), arguments: args },
});

t.test('a piece for a call already whole is dropped: the agent runs what was decided', async (t) => {
  const stream =
    chunk([{ index: 0, delta: { tool_calls: [tc(0, '{"a":', 'c1', 'f')] } }]) +
    chunk([{ index: 0, delta: { tool_calls: [tc(1, '{}', 'c2', 'g')] } }]) +
    chunk([{ index: 0, delta: { tool_calls: [tc(0, '1}')] } }]) +
    chunk([{ index: 0, delta: {}, finish_reason: 'tool_calls' }]) +
    'data: [DONE]\n\n';
  const decided: string[] = [];
  const { out } = await through(F, [Buffer.from(stream)], async (c) => {
    decided.push(`${c.name}:${c.arguments}`);
    return { allow: true, message: '' };
  });
  t.same(decided, ['f:{"a":', 'g:{}'], 'f was whole when g began (as the SDK reads it)');
  t.same(
    entries(out).map((e: Obj) => `${e.index}:${e.function.arguments}`),
    ['0:{"a":', '1:{}'],
    'the late piece never reaches the agent',
  );
});

t.test('several choices, several calls in one chunk: each choice gated and re-indexed on its own', async (t) => {
  const stream =
    chunk([
      { index: 0, delta: { tool_calls: [tc(0, '{}', 'a0', 'deny_me'), tc(1, '{}', 'a1', 'ok')] } },
      { index: 1, delta: { tool_calls: [tc(0, '{}', 'b0', 'ok')] } },
    ]) +
    chunk([
      { index: 0, delta: {}, finish_reason: 'tool_calls' },
      { index: 1, delta: { tool_calls: [tc(1, '{}', 'b1', 'deny_me')] }, finish_reason: 'tool_calls' },
    ]) +
    'data: [DONE]\n\n';
  const { out, gate } = await through(F, [Buffer.from(stream)], refuse('deny_me'));
  t.same(
    gate.calls.map((c) => `${c.call!.id}:${c.state}`),
    ['a0:refused', 'a1:allowed', 'b0:allowed', 'b1:refused'],
  );
  const [first, second] = chunks(out);
  t.same(first.choices[0].delta, { tool_calls: [tc(0, '{}', 'a1', 'ok')], content: 'no deny_me' });
  t.same(first.choices[1].delta, { tool_calls: [tc(0, '{}', 'b0', 'ok')] });
  t.same(second.choices[1], { index: 1, delta: { content: 'no deny_me' }, finish_reason: 'tool_calls' });
});

t.test('custom tool calls and the legacy function_call are decided and rewritten too', async (t) => {
  const custom = (index: number, input: string, id?: string, name?: string) => ({
    index,
    ...(id ? { id, type: 'custom' } : {}),
    custom: { ...(name ? { name } : {}), input },
  });
  const stream =
    chunk([{ index: 0, delta: { role: 'assistant', tool_calls: [custom(0, 'rm -rf ', 'c1', 'shell')] } }]) +
    chunk([{ index: 0, delta: { tool_calls: [custom(0, '/')] } }]) +
    chunk([{ index: 0, delta: { tool_calls: [tc(1, '{}', 'c2', 'ok')] } }]) +
    chunk([{ index: 0, delta: {}, finish_reason: 'tool_calls' }]) +
    chunk([{ index: 1, delta: { function_call: { name: 'old_style', arguments: '{"a"' } } }]) +
    chunk([{ index: 1, delta: { function_call: { arguments: ':1}' } } }]) +
    chunk([{ index: 1, delta: {}, finish_reason: 'function_call' }]) +
    'data: [DONE]\n\n';
  const decided: string[] = [];
  const { out } = await through(F, [Buffer.from(stream)], async (c) => {
    decided.push(`${c.id}:${c.name}:${c.arguments}`);
    return c.name === 'ok' ? { allow: true, message: '' } : { allow: false, message: `no ${c.name} (${c.id})` };
  });
  t.same(decided, ['c1:shell:rm -rf /', 'c2:ok:{}', 'function_call:old_style:{"a":1}']);
  const all = chunks(out);
  t.same(all[0].choices[0].delta, { role: 'assistant', content: 'no shell (c1)' });
  t.same(all[1].choices[0].delta, { tool_calls: [tc(0, '{}', 'c2', 'ok')] }, 'the function call becomes index 0');
  t.equal(all[2].choices[0].finish_reason, 'tool_calls');
  t.same(all[3].choices[0], { index: 1, delta: { content: 'no old_style (function_call)' } });
  t.same(all[4].choices[0], { index: 1, delta: {}, finish_reason: 'stop' }, 'no function call left');
  t.notMatch(out.toString(), /rm -rf|old_style"/);
});
