import fc from 'fast-check';
import t from 'tap';
import { conversationParts, group, MIN_PART_BYTES, skeleton } from '../../pipeline/conversation-parts.ts';
import { MAX_CACHED_BODY_BYTES } from '../../pipeline/engine.ts';
import { PartCache } from '../../pipeline/part-cache.ts';
import { partHash, ResentParts } from '../../pipeline/resent-parts.ts';
import { engine, findingKeys, metric, policyOf, same } from './part-cache-fixture.ts';

// The per-part inspection cache must never change what inspection finds: for any conversation,
// inspected turn by turn, an engine with the cache finds exactly what an engine without it finds, and
// decides the same (docs/decisions.md, "The per-part inspection cache").
// CACHE_PROPERTY_RUNS sets how many conversations each property tries (10,000 each passed here).

const FULL = policyOf({
  model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
  content_inspection: {
    secrets_filter: { enabled: true },
    pii_detection: { enabled: true },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: [
      { pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' },
      { pattern: 'launch code [a-z]{6}', description: 'launch', severity: 'block' },
    ],
  },
});
const SECRETS = ['hunter2hunter2', 'correct-horse-battery'];
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };

// What can leak, and ways of hiding it.
const LEAKS = [
  'AKIAIOSFODNN7EXAMPLE',
  'sk-ant-api03-' + 'a'.repeat(90) + 'AA',
  'ghp_' + 'b'.repeat(36),
  'mail bob@example.com now',
  'ssn 123-45-6789',
  'card 4111 1111 1111 1111',
  'hunter2hunter2',
  'correct-horse-battery',
  'project-42',
  'launch code abcdef',
  'AKIA\u200bIOSFODNN7EXAMPLE',
  'hun\u00adter2hunter2',
  'ｐｒｏｊｅｃｔ－７',
  'bob&#64;example.com',
  'nothing to see',
  'quote " and backslash \\ here',
];

const fragment = fc.oneof(
  { arbitrary: fc.constantFrom(...LEAKS), weight: 1 },
  { arbitrary: fc.string({ maxLength: 12 }), weight: 4 },
  { arbitrary: fc.constantFrom('lorem ipsum '.repeat(30), 'tool output\n'.repeat(40)), weight: 3 },
);
const text = fc.array(fragment, { minLength: 1, maxLength: 5 }).map((a) => a.join(' '));

type Escape = 'none' | 'unicode' | 'slash' | 'nested';
interface Message {
  value: unknown;
  escape: Escape;
}

const message: fc.Arbitrary<Message> = fc.record({
  value: fc.oneof(
    fc.record({ role: fc.constantFrom('user', 'assistant'), content: text }),
    fc.record({
      role: fc.constant('assistant'),
      content: fc.tuple(text, text).map(([a, b]) => [
        { type: 'text', text: a },
        { type: 'tool_use', id: 'toolu_1', name: 'bash', input: { command: b } },
      ]),
    }),
    fc.record({
      role: fc.constant('user'),
      content: text.map((b) => [{ type: 'tool_result', tool_use_id: 'toolu_1', content: JSON.stringify({ out: b }) }]),
    }),
  ),
  escape: fc.constantFrom<Escape>('none', 'none', 'unicode', 'slash', 'nested'),
});

/** The JSON of a value with characters spelled as escapes, as an agent's encoder may send them. */
function encode(value: unknown, spelling: Escape): string {
  const json = JSON.stringify(value);
  if (spelling === 'unicode')
    return json.replace(/[@A-Z-]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (spelling === 'slash') return json.replace(/-/g, '\\/');
  if (spelling === 'nested') return JSON.stringify({ wrapped: json }).slice(0, -1).concat(',"n":1}');
  return json;
}

interface Conversation {
  format: 'anthropic' | 'responses';
  system: string;
  top: string;
  messages: Message[];
  tools: boolean;
}

const conversation: fc.Arbitrary<Conversation> = fc.record({
  format: fc.constantFrom<'anthropic' | 'responses'>('anthropic', 'responses'),
  system: text,
  top: fc.oneof(fc.constant(''), text),
  messages: fc.array(message, { minLength: 1, maxLength: 7 }),
  tools: fc.boolean(),
});

const TOOL = { name: 'bash', description: 'runs a command '.repeat(20), input_schema: { type: 'object' } };

function bodyAt(c: Conversation, turns: number): Buffer {
  const list = c.messages
    .slice(0, turns)
    .map((m) => encode(m.value, m.escape))
    .join(',');
  const model = JSON.stringify('claude-sonnet-4-5');
  const system = JSON.stringify(`You are inspected. ${c.system}`);
  const items =
    c.format === 'anthropic' ? `"system":${system},"messages":[${list}]` : `"instructions":${system},"input":[${list}]`;
  const tools = c.tools ? `,"tools":[${JSON.stringify(TOOL)}]` : '';
  const top = c.top === '' ? '' : `,"metadata":{"note":${JSON.stringify(c.top)}}`;
  return Buffer.from(`{"model":${model},${items}${tools}${top},"max_tokens":1024}`);
}

t.test('parts are exactly the elements (short ones grouped); the skeleton keeps every other byte', async (t) => {
  const body = Buffer.from(
    `{"model":"m","system":"s","messages":[ ${JSON.stringify({ role: 'user', content: 'x'.repeat(300) })} , {"role":"user","content":"ok"}, ${JSON.stringify({ role: 'assistant', content: 'y'.repeat(300) })}],"tools":[],"input":"text"}`,
  );
  const parts = conversationParts(body)!;
  t.equal(parts.length, 3, 'the short element is a part of its own, closed by the long one after it');
  t.same(
    parts.map((p) => JSON.parse(body.toString('utf8', p.start, p.end)).content.length),
    [300, 2, 300],
  );
  const skel = skeleton(body, parts);
  t.same(JSON.parse(skel.toString()).messages, [null, null, null]);
  t.equal(skel.length + parts.reduce((n, p) => n + p.end - p.start, 0) - 4 * parts.length, body.length);
  t.same(
    JSON.parse(group(body, parts).toString()).map((m: { role: string }) => m.role),
    ['user', 'user', 'assistant'],
  );
  for (const bad of ['[1,2]', '{"messages":[', 'not json', '{"messages":[{"a":"b"}]} trailing', '{}', ''])
    t.equal(conversationParts(Buffer.from(bad), 1), null, `no parts: ${bad}`);
  t.equal(conversationParts(Buffer.from('{"messages":[{"a":1}]}'), 1)!.length, 1);
  t.equal(MIN_PART_BYTES, 256);
});

t.test('the LRU stays under its cap and counts what it drops', async (t) => {
  let evicted = 0;
  const cache = new PartCache({ maxBytes: 4096, onEvict: (n) => (evicted += n) });
  const context = cache.context('request', 'v1', [], ['secrets']);
  const keys: string[] = [];
  for (let i = 0; i < 100; i++) {
    const key = cache.key(context, Buffer.from(`part ${i}`));
    keys.push(key);
    cache.set(key, []);
    t.ok(cache.bytes <= 4096);
  }
  t.ok(evicted > 0 && cache.size < 100);
  t.equal(cache.get(keys[0]), undefined, 'the oldest went first');
  t.same(cache.get(keys[99]), []);
  t.not(cache.context('request', 'v2', [], ['secrets']), context, 'another policy version, another key');
  t.not(cache.context('request', 'v1', ['a-new-secret'], ['secrets']), context, 'another secret, another key');
  t.not(cache.context('response', 'v1', [], ['secrets']), context, 'another phase, another key');
  t.not(cache.context('request', 'v1', [], ['secrets', 'pii']), context, 'other inspectors, another key');
  const mutable = ['secret-one-value'];
  const before = cache.context('request', 'v1', mutable, ['secrets']);
  mutable.push('secret-two-value');
  t.not(cache.context('request', 'v1', mutable, ['secrets']), before, 'an array changed in place: another key');
});

for (const [name, options] of [
  ['inline', { threads: 0 }],
  ['pool, small groups', { threads: 1, inlineThresholdBytes: 1024, timeoutMs: 30_000 }],
] as const) {
  t.test(`turn by turn, the cache finds exactly what a full scan finds (${name})`, async (t) => {
    const plain = engine(t, { threads: 0, cacheBytes: 0 });
    const cached = engine(t, options);
    let turns = 0;
    let blocked = 0;
    let clean = 0;
    await fc.assert(
      fc.asyncProperty(conversation, fc.boolean(), async (c, withSecrets) => {
        const secrets = withSecrets ? SECRETS : [];
        for (let turn = 1; turn <= c.messages.length; turn++) {
          const body = bodyAt(c, turn);
          // One agent: resent parts are found by comparing them with its earlier bodies (resent-parts.ts).
          const request = { body, phase: 'request' as const, policy: FULL, secrets, identity: AGENT };
          const want = await plain.e.inspect(request);
          const got = await cached.e.inspect(request);
          turns++;
          if (want.decision === 'block') blocked++;
          if (want.findings.length === 0) clean++;
          if (!same(t, got, want, `turn ${turn} of ${body.toString()}`)) return false;
        }
        return true;
      }),
      { numRuns: Number(process.env.CACHE_PROPERTY_RUNS ?? (name === 'inline' ? 150 : 40)) },
    );
    t.ok(blocked > 0 && clean > 0, `both kinds of turn were tried: ${blocked} blocked, ${clean} clean of ${turns}`);
    t.ok((await metric(cached.registry, 'dvx_inspection_cache_hits_total')) > 0, 'resent parts were hits');
    t.ok((await metric(cached.registry, 'dvx_inspection_cache_bytes_saved_total')) > 0);
    t.ok(
      (await metric(cached.registry, 'dvx_inspection_cache_parts_compared_total')) > 0,
      'resent parts were compared, not hashed again',
    );
  });
}

t.test('a resent part is stepped over and keeps its hash only when its bytes are the same', async (t) => {
  // Any sequence of bodies, each an edit of an earlier one (a byte changed, parts added, removed or
  // swapped, bytes inserted before them): every hash is the sha256 of the part's own bytes.
  const resent = new ResentParts(1 << 20);
  // Short elements too: they are grouped, and a group recalled short is left open (conversation-parts.ts).
  const element = fc.oneof(fc.string({ minLength: 256, maxLength: 400 }), fc.string({ maxLength: 120 }));
  let reused = 0;
  let stepped = 0;
  await fc.assert(
    fc.asyncProperty(
      fc.array(element, { minLength: 1, maxLength: 6 }),
      fc.array(
        fc.record({
          kind: fc.constantFrom('flip', 'append', 'drop', 'swap', 'prefix'),
          at: fc.nat(),
          text: element,
        }),
        { maxLength: 8 },
      ),
      fc.constantFrom('agent-a', 'agent-b'),
      async (first, edits, holder) => {
        let messages = first;
        let system = 's';
        const check = () => {
          const body = Buffer.from(JSON.stringify({ system, messages: messages.map((content) => ({ content })) }));
          const walked = conversationParts(body);
          const recall = resent.recall(holder, body);
          const parts = conversationParts(body, MIN_PART_BYTES, recall?.known);
          // Stepping over the recalled parts finds exactly the parts a whole walk finds.
          if (JSON.stringify(parts) !== JSON.stringify(walked)) return false;
          if (parts === null) return true;
          const out = resent.hashes(holder, body, parts, recall);
          reused += out.reused;
          stepped += recall?.verified ?? 0;
          return parts.every((p, k) => out.hashes[k] === partHash(body.subarray(p.start, p.end)));
        };
        if (!check()) return false;
        for (const edit of edits) {
          const k = edit.at % messages.length;
          if (edit.kind === 'flip') {
            const m = messages[k];
            const i = edit.at % m.length;
            messages = messages.with(k, m.slice(0, i) + (m[i] === 'x' ? 'y' : 'x') + m.slice(i + 1));
          } else if (edit.kind === 'append') messages = [...messages, edit.text];
          else if (edit.kind === 'drop' && messages.length > 1) messages = messages.toSpliced(k, 1);
          else if (edit.kind === 'swap') messages = messages.with(k, edit.text);
          else system += edit.text.slice(0, 3);
          if (!check()) return false;
        }
        return true;
      },
    ),
    { numRuns: 300 },
  );
  t.ok(reused > 0, `hashes were reused (${reused})`);
  t.ok(stepped > 0, `the walk stepped over recalled parts (${stepped})`);
  t.ok(resent.bytes <= 1 << 20, 'the remembered bodies stay under the cap');
});

t.test('a cached block still blocks, with its finding; a one-byte change misses', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const leak = { role: 'user', content: `deploy with AKIAIOSFODNN7EXAMPLE ${'lorem ipsum '.repeat(40)}` };
  const reply = { role: 'assistant', content: 'I will not. '.repeat(40) };
  const turn = (messages: unknown[]) =>
    Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system: 'be safe', messages }));
  const first = await e.inspect({ body: turn([leak]), phase: 'request', policy: FULL, identity: AGENT });
  t.equal(first.decision, 'block');
  // First sight: scanned whole. Resent: its parts are scanned and stored, the leak with its finding.
  const resent = await e.inspect({ body: turn([leak, reply]), phase: 'request', policy: FULL, identity: AGENT });
  t.equal(resent.decision, 'block');
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 0);
  const second = await e.inspect({
    body: turn([leak, reply, { role: 'user', content: 'ok' }]),
    phase: 'request',
    policy: FULL,
    identity: AGENT,
  });
  t.equal(second.decision, 'block', 'the cached part still blocks');
  t.same(findingKeys(second.findings), findingKeys(first.findings));
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 2, 'the leak and the reply');
  for (const f of second.findings) f.match = 'changed by the caller';
  const again = await e.inspect({ body: turn([leak]), phase: 'request', policy: FULL });
  t.same(findingKeys(again.findings), findingKeys(first.findings), 'what a caller does with an outcome stays with it');
  const changed = { ...reply, content: reply.content.replace('I will not.', 'I will not!') };
  await e.inspect({ body: turn([leak, changed]), phase: 'request', policy: FULL, identity: AGENT });
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 4, 'the leak hit again');
  // Misses: the leak and the reply (resent), the short `ok` (a part of its own), the changed reply.
  t.equal(await metric(registry, 'dvx_inspection_cache_misses_total'), 4, 'the changed reply missed');
});

t.test('a policy change catches what a cached part holds; the system prompt is always scanned', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const old = { role: 'user', content: `the codename is bluebird-9 ${'lorem ipsum '.repeat(40)}` };
  const body = (system: string) => Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system, messages: [old] }));
  t.same((await e.inspect({ body: body('hi'), phase: 'request', policy: FULL })).findings, []);
  const stricter = policyOf({
    content_inspection: { patterns: [{ pattern: 'bluebird-[0-9]', description: 'bird', severity: 'block' }] },
  });
  const out = await e.inspect({ body: body('hi'), phase: 'request', policy: stricter });
  t.equal(out.decision, 'block', 'the new pattern finds the old message');
  const sys = await e.inspect({ body: body('mail bob@example.com'), phase: 'request', policy: FULL });
  t.same(
    sys.findings.map((f) => f.inspector_type),
    ['pii'],
    'the system prompt is scanned though the message is cached',
  );
});

t.test('a failed scan is never cached', async (t) => {
  // A pool whose worker crashes on this part: its scan fails (a recorded fail-open), and is not stored.
  const { e, registry } = engine(t, {
    threads: 1,
    inlineThresholdBytes: 512,
    workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
  });
  const big = { role: 'user', content: `CRASH-WORKER ${'lorem ipsum '.repeat(100)}` };
  const body = Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system: 's', messages: [big] }));
  for (let i = 0; i < 2; i++) {
    const out = await e.inspect({ body, phase: 'request', policy: FULL });
    t.ok(out.failOpen, 'failed, recorded as a fail-open');
    t.ok(out.failures.length > 0);
  }
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 0, 'nothing to hit: the failure was not stored');
  t.equal(await metric(registry, 'dvx_inspection_cache_misses_total'), 2);
});

t.test('the response phase is always scanned whole, never from the cache', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const answer = Buffer.from(
    JSON.stringify({
      id: 'msg_1',
      type: 'message',
      role: 'assistant',
      content: [{ type: 'text', text: `Your password is hunter2hunter2. ${'lorem ipsum '.repeat(40)}` }],
      messages: [{ role: 'assistant', content: `see project-42 ${'lorem ipsum '.repeat(40)}` }],
    }),
  );
  const stream = Buffer.from(
    ['hunter2', 'hunter2', ' and more'.repeat(40)]
      .map(
        (text) =>
          `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } })}\n\n`,
      )
      .join(''),
  );
  for (const body of [answer, answer, stream, stream]) {
    const out = await e.inspect({ body, phase: 'response', policy: FULL, secrets: SECRETS });
    t.ok(
      out.findings.some((f) => f.inspector_type === 'secrets' && f.location === 'response_body'),
      'found each time',
    );
  }
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 0);
  t.equal(await metric(registry, 'dvx_inspection_cache_misses_total'), 0, 'not even looked up');
});

t.test('model restriction: the top level is always checked; pass-through routes do not use the cache', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const nested = { role: 'user', content: 'lorem ipsum '.repeat(40), model: 'gpt-3.5-turbo' };
  const body = (model: string) => Buffer.from(JSON.stringify({ model, messages: [nested, nested] }));
  for (const model of ['claude-sonnet-4-5', 'gpt-3.5-turbo', 'claude-sonnet-4-5']) {
    const request = { body: body(model), phase: 'request' as const, policy: FULL };
    const got = await e.inspect(request);
    same(t, got, await plain.e.inspect(request), model);
    t.equal(got.decision, model.startsWith('gpt-3') ? 'block' : 'allow', `${model}: the call's own model decides`);
  }
  const hits = await metric(registry, 'dvx_inspection_cache_hits_total');
  t.ok(hits > 0, 'the messages came from the cache');
  for (let i = 0; i < 2; i++) {
    const out = await e.inspect({
      body: body('claude-sonnet-4-5'),
      phase: 'request',
      policy: FULL,
      modelsAnywhere: { contentType: 'application/json' },
    });
    t.equal(out.decision, 'block', 'a pass-through body names gpt-3.5 inside: refused each time');
  }
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), hits, 'without the cache');
});

t.test('a body of MAX_CACHED_BODY_BYTES or more is scanned whole, not looked up', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const filler = { role: 'user', content: 'lorem ipsum '.repeat(1000) };
  const messages = Array.from({ length: Math.ceil(MAX_CACHED_BODY_BYTES / 12_000) + 1 }, () => filler);
  messages.push({ role: 'user', content: 'AKIAIOSFODNN7EXAMPLE' });
  const body = Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages }));
  t.ok(body.length >= MAX_CACHED_BODY_BYTES);
  for (let i = 0; i < 2; i++) t.equal((await e.inspect({ body, phase: 'request', policy: FULL })).decision, 'block');
  t.equal(await metric(registry, 'dvx_inspection_cache_misses_total'), 0);
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 0);
});
