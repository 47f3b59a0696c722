import t from 'tap';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { denialMessage } from '../../../../proxy/llm/tools/denial.ts';
import { decidePlainAnswer, PLAIN_CODECS, type PlainDecision } from '../../../../proxy/llm/tools/plain.ts';
import type { AnswerJson, Decide, ToolCall } from '../../../../proxy/llm/tools/types.ts';

const anthropic = PLAIN_CODECS['anthropic-messages'];
const chat = PLAIN_CODECS['openai-chat'];
const responses = PLAIN_CODECS['openai-responses'];
const refuse = (entries: [number, string][]) => new Map(entries);

t.test('denial text, detailed and opaque', async (t) => {
  const call = { name: 'transfer', id: 'toolu_1' };
  t.equal(
    denialMessage(call, 'denied by rule payments.rules[0]', 'detailed'),
    '[dvx] The tool call transfer (id toolu_1) was not run: denied by rule payments.rules[0].',
  );
  t.equal(
    denialMessage(call, 'ends with a period.', 'detailed'),
    '[dvx] The tool call transfer (id toolu_1) was not run: ends with a period.',
  );
  t.equal(
    denialMessage(call, 'denied by rule payments.rules[0]', 'opaque'),
    '[dvx] The tool call transfer (id toolu_1) was not run: refused by policy.',
  );
});

t.test('anthropic: tool_use blocks; a refused one becomes a text block in place', async (t) => {
  const answer: AnswerJson = {
    id: 'msg_1',
    type: 'message',
    role: 'assistant',
    model: 'claude',
    content: [
      { type: 'text', text: 'Two things.' },
      { type: 'tool_use', id: 'toolu_a', name: 'get_weather', input: { city: 'Paris' } },
      { type: 'server_tool_use', id: 'srvtoolu_1', name: 'web_search', input: { query: 'x' } },
      { type: 'tool_use', id: 'toolu_b', name: 'transfer', input: { amount: 900, nested: { '\u0000': [1e21] } } },
    ],
    stop_reason: 'tool_use',
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 20 },
  };
  t.same(anthropic.calls(answer), [
    { seq: 0, id: 'toolu_a', name: 'get_weather', arguments: '{"city":"Paris"}' },
    {
      seq: 1,
      id: 'toolu_b',
      name: 'transfer',
      arguments: JSON.stringify({ amount: 900, nested: { '\u0000': [1e21] } }),
    },
  ]);
  const one = anthropic.rewrite(answer, refuse([[1, 'no.']]));
  t.same(one, {
    ...answer,
    content: [...(answer.content as unknown[]).slice(0, 3), { type: 'text', text: 'no.' }],
  });
  t.equal(one.stop_reason, 'tool_use', 'an allowed call remains');
  const both = anthropic.rewrite(
    answer,
    refuse([
      [0, 'a'],
      [1, 'b'],
    ]),
  );
  t.equal(both.stop_reason, 'end_turn');
  t.same(both.usage, answer.usage);
  t.same(
    (both.content as unknown[]).map((b) => (b as { type: string }).type),
    ['text', 'text', 'server_tool_use', 'text'],
  );
  t.equal(anthropic.rewrite(answer, refuse([])), answer, 'nothing refused: the same object');
  t.same(answer.content, [...(answer.content as unknown[])], 'the input is not changed');
  t.same(anthropic.calls({ content: 'text' }), [], 'odd shapes: no calls, no throw');
  t.same(anthropic.calls({ content: [null, 1, { type: 'tool_use' }] }), [{ seq: 0, id: '', name: '', arguments: '' }]);
});

t.test('openai chat: every choice, seq across them, refused calls out of tool_calls, denial in content', async (t) => {
  const fn = (id: string, name: string, args: string) => ({
    id,
    type: 'function',
    function: { name, arguments: args },
  });
  const answer: AnswerJson = {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: 'Sure.', tool_calls: [fn('c1', 'a', '{}'), fn('c2', 'b', '{"x":1}')] },
        finish_reason: 'tool_calls',
      },
      {
        index: 1,
        message: { role: 'assistant', content: null, tool_calls: [fn('c3', 'a', '{"y":2}')] },
        finish_reason: 'tool_calls',
      },
      { index: 2, message: { role: 'assistant', content: 'no tools' }, finish_reason: 'stop' },
      {
        index: 3,
        message: { role: 'assistant', content: null, function_call: { name: 'legacy', arguments: '{"z":3}' } },
        finish_reason: 'function_call',
      },
      {
        index: 4,
        message: {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'c5', type: 'custom', custom: { name: 'shell', input: 'rm -rf /' } }],
        },
        finish_reason: 'tool_calls',
      },
    ],
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  };
  t.same(
    chat.calls(answer).map((c: ToolCall) => [c.seq, c.id, c.name, c.arguments]),
    [
      [0, 'c1', 'a', '{}'],
      [1, 'c2', 'b', '{"x":1}'],
      [2, 'c3', 'a', '{"y":2}'],
      [3, 'function_call', 'legacy', '{"z":3}'],
      [4, 'c5', 'shell', 'rm -rf /'],
    ],
  );
  const out = chat.rewrite(
    answer,
    refuse([
      [0, 'D0'],
      [2, 'D2'],
      [3, 'D3'],
      [4, 'D4'],
    ]),
  );
  const choices = out.choices as { message: Record<string, unknown>; finish_reason: string }[];
  t.same(choices[0].message, { role: 'assistant', content: 'Sure.\n\nD0', tool_calls: [fn('c2', 'b', '{"x":1}')] });
  t.equal(choices[0].finish_reason, 'tool_calls', 'an allowed call remains in choice 0');
  t.same(choices[1].message, { role: 'assistant', content: 'D2' }, 'tool_calls dropped when empty');
  t.equal(choices[1].finish_reason, 'stop');
  t.equal(choices[2], (answer.choices as unknown[])[2], 'a choice without refusals is untouched');
  t.same(choices[3].message, { role: 'assistant', content: 'D3' });
  t.equal(choices[3].finish_reason, 'stop');
  t.same(choices[4].message, { role: 'assistant', content: 'D4' });
  t.same(out.usage, answer.usage);
  const two = chat.rewrite(
    answer,
    refuse([
      [0, 'x'],
      [1, 'y'],
    ]),
  );
  t.same(
    (two.choices as { message: unknown }[])[0].message,
    { role: 'assistant', content: 'Sure.\n\nx\n\ny' },
    'paragraphs',
  );
  // Calls that carry an index are re-indexed.
  const indexed: AnswerJson = {
    choices: [
      {
        message: {
          content: null,
          tool_calls: [
            { index: 0, ...fn('i0', 'a', '{}') },
            { index: 1, ...fn('i1', 'b', '{}') },
          ],
        },
        finish_reason: 'tool_calls',
      },
    ],
  };
  const re = chat.rewrite(indexed, refuse([[0, 'r']]));
  t.same((re.choices as { message: { tool_calls: unknown[] } }[])[0].message.tool_calls, [
    { index: 0, ...fn('i1', 'b', '{}') },
  ]);
});

t.test('openai responses: function_call items; call_id is the id; a refused one becomes a message item', async (t) => {
  const answer: AnswerJson = {
    id: 'resp_1',
    object: 'response',
    status: 'completed',
    output: [
      { type: 'reasoning', id: 'rs_1', summary: [] },
      { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'a', arguments: '{}', status: 'completed' },
      {
        type: 'message',
        id: 'msg_1',
        role: 'assistant',
        content: [{ type: 'output_text', text: 'hi', annotations: [] }],
      },
      { type: 'function_call', id: 'fc_2', call_id: 'call_2', name: 'b', arguments: '{"n":1}', status: 'completed' },
      { type: 'custom_tool_call', id: 'ctc_3', call_id: 'call_3', name: 'shell', input: 'ls' },
      { type: 'web_search_call', id: 'ws_1', status: 'completed' },
    ],
    usage: { input_tokens: 1, output_tokens: 2, total_tokens: 3 },
  };
  t.same(responses.calls(answer), [
    { seq: 0, id: 'call_1', name: 'a', arguments: '{}' },
    { seq: 1, id: 'call_2', name: 'b', arguments: '{"n":1}' },
    { seq: 2, id: 'call_3', name: 'shell', arguments: 'ls' },
  ]);
  const out = responses.rewrite(answer, refuse([[1, 'denied b']]));
  const output = out.output as Record<string, unknown>[];
  t.equal(output.length, 6);
  t.same(output[3], {
    type: 'message',
    id: 'msg_dvx_fc_2',
    status: 'completed',
    role: 'assistant',
    content: [{ type: 'output_text', text: 'denied b', annotations: [] }],
  });
  for (const i of [0, 1, 2, 4, 5]) t.equal(output[i], (answer.output as unknown[])[i], `item ${i} untouched`);
  t.same(out.usage, answer.usage);
});

const decideBy =
  (refusedNames: string[]): Decide =>
  async (call) =>
    refusedNames.includes(call.name)
      ? { allow: false, message: denialMessage(call, 'no', 'detailed') }
      : { allow: true, message: '' };

/** A real node:http exchange: `handler` gets the server's response; the client may leave. */
async function exchange(handler: (res: http.ServerResponse) => Promise<void>, clientLeaves: boolean) {
  let done!: Promise<void>;
  const server = http.createServer((_req, res) => {
    done = handler(res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const req = http.get(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`);
  req.on('error', () => {});
  await new Promise((r) => setTimeout(r, 50));
  if (clientLeaves) req.destroy();
  await done;
  req.destroy();
  await new Promise((r) => server.close(r));
}

t.test(
  'decidePlainAnswer: original bytes when nothing is refused, concurrently decided, rewritten otherwise',
  async (t) => {
    const body = Buffer.from(
      '{ "content": [ {"type":"tool_use","id":"t1","name":"a","input":{"n": 1.0}}, {"type":"tool_use","id":"t2","name":"b","input":{}} ], "stop_reason":"tool_use" }',
    );
    let result!: PlainDecision;
    let inFlight = 0;
    let most = 0;
    const concurrent: Decide = async (call) => {
      most = Math.max(most, ++inFlight);
      await new Promise((r) => setTimeout(r, 10));
      inFlight--;
      return decideBy([])(call);
    };
    await exchange(async (res) => {
      result = await decidePlainAnswer('anthropic-messages', body, concurrent, res);
      res.end();
    }, false);
    t.same(result, { kind: 'untouched', calls: 2 });
    t.equal(most, 2, 'both calls decided at once');

    await exchange(async (res) => {
      result = await decidePlainAnswer('anthropic-messages', body, decideBy(['b']), res);
      res.end();
    }, false);
    t.equal(result.kind, 'rewritten');
    const rewritten = JSON.parse((result as { body: Buffer }).body.toString());
    t.same(rewritten.content[1], { type: 'text', text: '[dvx] The tool call b (id t2) was not run: no.' });
    t.equal(rewritten.stop_reason, 'tool_use');

    await exchange(async (res) => {
      result = await decidePlainAnswer('openai-chat', Buffer.from('not json'), decideBy([]), res);
      res.end();
    }, false);
    t.equal(result.kind, 'unreadable');
    await exchange(async (res) => {
      result = await decidePlainAnswer('openai-chat', Buffer.from('[1]'), decideBy([]), res);
      res.end();
    }, false);
    t.same(result, { kind: 'unreadable', why: 'the answer is not a JSON object' });
  },
);

t.test('decidePlainAnswer: a decider that throws refuses (fail closed)', async (t) => {
  let result!: PlainDecision;
  const body = Buffer.from(
    JSON.stringify({ output: [{ type: 'function_call', call_id: 'c', name: 'x', arguments: '{}' }] }),
  );
  await exchange(async (res) => {
    result = await decidePlainAnswer('openai-responses', body, () => Promise.reject(new Error('boom')), res);
    res.end();
  }, false);
  t.equal(result.kind, 'rewritten');
  t.match((result as { body: Buffer }).body.toString(), /was not run: refused by policy\./);
});

t.test('decidePlainAnswer: the agent leaving while a call waits ends the wait', async (t) => {
  let result!: PlainDecision;
  let released = false;
  const body = Buffer.from(JSON.stringify({ content: [{ type: 'tool_use', id: 't', name: 'x', input: {} }] }));
  const never: Decide = () =>
    new Promise((resolve) =>
      setTimeout(() => {
        released = true;
        resolve({ allow: true, message: '' });
      }, 5_000).unref(),
    );
  await exchange(async (res) => {
    result = await decidePlainAnswer('anthropic-messages', body, never, res);
  }, true);
  t.same(result, { kind: 'gone' });
  t.notOk(released, 'did not wait for the decision');
});

t.test('openai responses: the built-in tools the agent runs (shell, computer, patch) are calls too', async (t) => {
  const shell = {
    type: 'local_shell_call',
    id: 'ls_1',
    call_id: 'call_ls',
    status: 'completed',
    action: { type: 'exec', command: ['rm', '-rf', '/'] },
  };
  const newShell = {
    type: 'shell_call',
    id: 'sh_1',
    call_id: 'call_sh',
    status: 'completed',
    action: { commands: ['curl x | sh'] },
  };
  const computer = {
    type: 'computer_call',
    id: 'cu_1',
    call_id: 'call_cu',
    status: 'completed',
    action: { type: 'click', x: 1, y: 2 },
    pending_safety_checks: [],
  };
  const patch = {
    type: 'apply_patch_call',
    id: 'ap_1',
    call_id: 'call_ap',
    status: 'completed',
    operation: { type: 'delete_file', path: '/etc/passwd' },
  };
  const answer: AnswerJson = {
    id: 'resp_1',
    object: 'response',
    output: [shell, newShell, computer, patch, { type: 'web_search_call', id: 'ws_1', status: 'completed' }],
  };
  t.same(
    responses.calls(answer).map((c) => [c.id, c.name, c.arguments]),
    [
      ['call_ls', 'local_shell', JSON.stringify(shell.action)],
      ['call_sh', 'shell', JSON.stringify(newShell.action)],
      ['call_cu', 'computer', JSON.stringify(computer.action)],
      ['call_ap', 'apply_patch', JSON.stringify(patch.operation)],
    ],
    'decided under their tool names, on their action or operation',
  );
  let decided: PlainDecision | undefined;
  await exchange(async (res) => {
    decided = await decidePlainAnswer(
      'openai-responses',
      Buffer.from(JSON.stringify(answer)),
      async (c) => (c.name === 'computer' ? { allow: true, message: '' } : { allow: false, message: `no ${c.name}` }),
      res,
    );
    res.end();
  }, false);
  t.equal(decided?.kind, 'rewritten');
  const out = JSON.parse((decided as Extract<PlainDecision, { kind: 'rewritten' }>).body.toString()) as AnswerJson;
  t.same(
    (out.output as { type: string }[]).map((o) => o.type),
    ['message', 'message', 'computer_call', 'message', 'web_search_call'],
    'the refused ones are message items in place; the provider-run item untouched',
  );
});
