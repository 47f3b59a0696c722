import { betaTool } from '@anthropic-ai/sdk/helpers/beta/json-schema';
import t from 'tap';
import { opsAgent, runToEnd } from '../../fixtures/ops-agent.ts';
import { baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';

// Real agent loops through llmproxy with a tool policy authored in the snapshot's `llm_policy`: the
// Anthropic SDK's tool runner (Messages) and the OpenAI Agents SDK (Responses API), plain and streamed.
// The upstream answers like a model: the scripted tool calls first, then, once a tool result is in the
// conversation, text. A denied tool is never executed, the loop ends normally, and the model's next turn
// carries the refusal in the assistant's own message.

const policy = {
  inspection: {
    inspectors: [
      {
        name: 'ops',
        rules: [
          { tool: 'delete_*', verdict: 'deny', summary: 'Deletions are not allowed' },
          { tool: 'transfer', verdict: 'deny', summary: 'Large transfers', arg_gt: { amount: 100 } },
        ],
      },
    ],
  },
};

const h = await startHarness({
  snapshot: (url) => {
    const s = baseSnapshot(url) as { orgs: Record<string, { config: Record<string, unknown> }> };
    s.orgs['org-1'].config.llm_policy = { value: policy };
    return s;
  },
});
t.teardown(() => h.close());

const script = (calls: { name: string; input: unknown }[]) => ({
  'x-test-tools': JSON.stringify(calls),
  'x-test-reply': 'On it.',
});

const DENIAL =
  /^\[dvx\] The tool call delete_file \(id \S+\) was not run: denied by rule ops\.rules\[0\] \(Deletions are not allowed\)/;

for (const stream of [false, true]) {
  for (const thread of [true, false]) {
    const how = `${stream ? ', streamed' : ''}${thread ? ', server-held thread' : ', client-held history'}`;
    t.test(`Anthropic tool runner${how}: the denied tool never runs, the loop ends`, async (t) => {
      const ran: string[] = [];
      const client = h.anthropic(await h.token()).withOptions({
        defaultHeaders: script([
          { name: 'get_weather', input: { city: 'Paris' } },
          { name: 'delete_file', input: { path: '/etc/passwd' } },
        ]),
      });
      const tools = [
        betaTool({
          name: 'get_weather',
          description: 'Weather of a city',
          inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
          run: (input) => {
            ran.push(`get_weather:${input.city}`);
            return 'sunny';
          },
        }),
        betaTool({
          name: 'delete_file',
          description: 'Deletes a file',
          inputSchema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
          run: (input) => {
            ran.push(`delete_file:${input.path}`);
            return 'deleted';
          },
        }),
      ];
      const before = h.upstream.received.length;
      const runner = client.beta.messages.toolRunner({
        model: 'claude-sonnet-4-5',
        max_tokens: 256,
        messages: [{ role: 'user', content: 'Weather in Paris, then clean up.' }],
        tools,
        ...(thread ? {} : { thread: false as const }),
        ...(stream ? { stream: true as const, runToolsEagerly: true } : {}),
      });
      const final = await runner.runUntilDone();
      t.same(ran, ['get_weather:Paris'], 'only the allowed tool ran');
      t.equal(final.stop_reason, 'end_turn');
      t.same(
        final.content.map((b) => b.type),
        ['text'],
      );
      const turns = h.upstream.received.slice(before);
      t.equal(turns.length, 2, 'two turns: the calls, then the answer to the tool result');
      type Block = { type: string; text?: string; tool_use_id?: string; is_error?: boolean; content?: unknown };
      const history = turns[1].body!.messages as { role: string; content: Block[] }[];
      const results = history.at(-1)!.content.filter((b) => b.type === 'tool_result');
      if (thread) {
        // The provider holds the original answer, refused call included: its result is the refusal.
        t.same(
          results.map((b) => [b.tool_use_id, b.is_error === true]),
          [
            ['toolu_2', true],
            ['toolu_1', false],
          ],
          'the refused call answered by an error tool result, the allowed one by its run',
        );
        t.match(results[0].content, DENIAL, 'the refusal, as the agent read it');
      } else {
        const assistant = history.find((m) => m.role === 'assistant')!;
        t.same(
          assistant.content.map((b) => b.type),
          ['text', 'tool_use', 'text'],
          'the assistant turn the model sees again: its text, the allowed call, the refusal',
        );
        t.match(assistant.content[2].text, DENIAL, 'the model reads the refusal on its next turn');
        t.same(
          results.map((b) => b.tool_use_id),
          ['toolu_1'],
          'a result for the allowed call only: the refused one was never a call',
        );
      }
    });
  }

  t.test(`Anthropic tool runner${stream ? ', streamed' : ''}: every call denied ends the turn at once`, async (t) => {
    const ran: string[] = [];
    const client = h.anthropic(await h.token()).withOptions({
      defaultHeaders: script([{ name: 'transfer', input: { amount: 5000, to: 'mallory' } }]),
    });
    const runner = client.beta.messages.toolRunner({
      model: 'claude-sonnet-4-5',
      max_tokens: 256,
      messages: [{ role: 'user', content: 'Pay mallory.' }],
      tools: [
        betaTool({
          name: 'transfer',
          description: 'Moves money',
          inputSchema: { type: 'object', properties: { amount: { type: 'number' }, to: { type: 'string' } } },
          run: () => {
            ran.push('transfer');
            return 'sent';
          },
        }),
      ],
      ...(stream ? { stream: true as const, runToolsEagerly: true } : {}),
    });
    const final = await runner.runUntilDone();
    t.same(ran, [], 'nothing ran');
    t.equal(final.stop_reason, 'end_turn');
    t.match(
      final.content.at(-1)!.type === 'text' && (final.content.at(-1) as { text: string }).text,
      /was not run: denied by rule ops\.rules\[1\] \(Large transfers\): amount is 5000, greater than 100/,
    );
  });

  t.test(`OpenAI Agents SDK (Responses)${stream ? ', streamed' : ''}: the denied tool never runs`, async (t) => {
    const ran: string[] = [];
    const client = h.openai(await h.token()).withOptions({
      defaultHeaders: script([
        { name: 'get_weather', input: { city: 'Oslo' } },
        { name: 'delete_file', input: { path: '/srv/data' } },
      ]),
    });
    const agent = opsAgent(client, ran);
    const before = h.upstream.received.length;
    const output = await runToEnd(agent, 'Weather in Oslo, then clean up.', { stream });
    t.same(ran, ['get_weather:Oslo'], 'only the allowed tool ran');
    t.equal(output, 'On it.', "the loop ended on the model's text");
    const turns = h.upstream.received.slice(before);
    t.equal(turns.length, 2);
    const input = turns[1].body!.input as { type?: string; role?: string; content?: unknown; name?: string }[];
    t.notOk(
      input.some((i) => i.type === 'function_call' && i.name === 'delete_file'),
      'the refused call was never a call',
    );
    t.ok(
      input.some((i) => i.type === 'function_call_output'),
      'the allowed call was run and its output sent',
    );
    t.match(JSON.stringify(input), /\[dvx\] The tool call delete_file \(id call_2\) was not run/);
  });
}
