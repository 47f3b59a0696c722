import t from 'tap';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The prefix step: the security-context prefix in every shape of system prompt, spliced in place,
// and the body shapes it refuses (400).
const h = await startHarness();
t.teardown(() => h.close());

t.test('400 when the body is not what the format needs', async (t) => {
  for (const [path, body] of [
    ['/v1/messages', '{"model":'],
    ['/v1/messages', '[1,2]'],
    ['/v1/messages', anthropicBody('x', { system: 42 })],
    ['/v1/chat/completions', '{"model":"gpt-4o"}'],
  ] as const) {
    const r = await post(h, path, body);
    t.equal(r.status, 400, `${path} ${body.slice(0, 20)}`);
    t.match(JSON.parse(r.text), { type: 'error', error: { type: 'invalid_request_error' } });
  }
});

t.test('the system prompt gets the prefix in every shape', async (t) => {
  await post(h, '/v1/messages', anthropicBody('x', { system: [{ type: 'text', text: 'mine' }] }));
  t.match(h.upstream.received.at(-1)!.body!.system, [
    { type: 'text', text: /^\[dvx security context\]/ },
    { type: 'text', text: 'mine' },
  ]);
  await post(h, '/v1/messages', anthropicBody('x'));
  t.match(h.upstream.received.at(-1)!.body!.system, /^\[dvx security context\]/);
  await post(h, '/v1/responses', JSON.stringify({ model: 'gpt-4o', input: 'x' }));
  t.match(h.upstream.received.at(-1)!.body!.instructions, /^\[dvx security context\]/);
  const raw =
    '{"model":"claude-sonnet-4-5",  "max_tokens":8,\n "messages":[{"role":"user","content":"keep   my   spacing"}]}';
  await post(h, '/v1/messages', raw);
  const sent = h.upstream.received.at(-1)!.raw.toString();
  t.ok(sent.endsWith(raw.slice(1)), 'the rest of the body is forwarded byte for byte');
});

t.test('an empty array of system blocks or messages gets the prefix as its only element', async (t) => {
  for (const empty of ['[]', '[ \n\t ]']) {
    const r = await post(
      h,
      '/v1/messages',
      `{"model":"claude-sonnet-4-5","system":${empty},"max_tokens":8,"messages":[]}`,
    );
    t.equal(r.status, 200, `system ${JSON.stringify(empty)}`);
    t.match(h.upstream.received.at(-1)!.body!.system, [{ type: 'text', text: /^\[dvx security context\]/ }]);
    t.equal((h.upstream.received.at(-1)!.body!.system as unknown[]).length, 1);
    const c = await post(h, '/v1/chat/completions', `{"model":"gpt-4o","messages":${empty}}`);
    t.equal(c.status, 200, `messages ${JSON.stringify(empty)}`);
    t.same(
      (h.upstream.received.at(-1)!.body!.messages as { role: string }[]).map((m) => m.role),
      ['system'],
    );
  }
  // Not empty: the prefix goes first, a comma after it.
  await post(h, '/v1/chat/completions', '{"model":"gpt-4o","messages":[ {"role":"user","content":"hi"} ]}');
  t.same(
    (h.upstream.received.at(-1)!.body!.messages as { role: string }[]).map((m) => m.role),
    ['system', 'user'],
  );
});

t.test('the model is the one the body names, wherever it stands', async (t) => {
  for (const raw of [
    '{"system":"s","messages":[{"role":"user","content":"x"}],"max_tokens":8,"model":"claude-sonnet-4-5"}',
    '{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"x"}]}',
    '{"model":"other","max_tokens":8,"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"x","model":"no"}]}',
  ]) {
    const r = await post(h, '/v1/messages', raw);
    t.equal(r.status, 200, raw);
    t.equal(h.upstream.received.at(-1)!.body!.model, 'claude-sonnet-4-5');
  }
  const none = await post(h, '/v1/messages', '{"max_tokens":8,"messages":[{"role":"user","content":"x"}]}');
  t.equal(none.status, 400, 'no model: refused');
});

t.test('a large body gets the prefix spliced in place, every other byte as sent', async (t) => {
  // 300 KB is read into shared memory with room for the prefix; 60 KB arrives in several chunks, joined
  // with room behind them (read-body.ts); 2 KB arrives in one and is copied by the splice.
  for (const size of [300 * 1024, 60 * 1024, 2 * 1024]) {
    const big = 'y'.repeat(size);
    for (const [label, raw, head] of [
      [
        'system string',
        `{"model":"claude-sonnet-4-5","max_tokens":8,"system":"mine","messages":[{"role":"user","content":"${big}"}]}`,
        '{"model":"claude-sonnet-4-5","max_tokens":8,"system":"[dvx security context]',
      ],
      [
        'no system',
        `{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"${big}"}]}`,
        '{"system":"[dvx security context]',
      ],
      [
        'system blocks',
        `{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"mine"}],"max_tokens":8,"messages":[{"role":"user","content":"${big}"}]}`,
        '{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"[dvx security context]',
      ],
    ] as const) {
      const what = `${label}, ${size / 1024} KB`;
      t.equal((await post(h, '/v1/messages', raw)).status, 200, what);
      const sent = h.upstream.received.at(-1)!;
      const parsed = sent.body as { system: unknown; messages: { content: string }[] };
      t.equal(parsed.messages[0].content, big, `${what}: content intact`);
      t.match(JSON.stringify(parsed.system), /\[dvx security context\]/, `${what}: prefix present`);
      t.equal(sent.raw.subarray(0, head.length).toString(), head, `${what}: the head as sent, then the prefix`);
      const prefixEnd = sent.raw.indexOf('"messages"');
      t.ok(
        sent.raw.subarray(prefixEnd).equals(Buffer.from(raw.slice(raw.indexOf('"messages"')))),
        `${what}: the tail is byte for byte`,
      );
    }
  }
});
