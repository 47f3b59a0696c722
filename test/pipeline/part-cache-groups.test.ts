import fc from 'fast-check';
import t from 'tap';
import { conversationParts, MIN_PART_BYTES, skeleton } from '../../pipeline/conversation-parts.ts';
import { engine, metric, policyOf, same } from './part-cache-fixture.ts';

// Short elements in groups (conversation-parts.ts, docs/decisions.md "Short elements in groups"):
// consecutive elements shorter than MIN_PART_BYTES are parts together, closed once they span that
// many bytes, before a long element, or at the array's end. An agent that appends short messages then
// keeps the same skeleton from turn to turn (it used to be rescanned each turn, system prompt and
// all), and the cache still finds exactly what a scan of the whole body finds.

const POLICY = policyOf({
  model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
  content_inspection: {
    secrets_filter: { enabled: true },
    pii_detection: { enabled: true },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: [
      { pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' },
      // Matches only between elements: inside a group, or in the skeleton between parts. (A pattern that
      // spans a part's edge, `\\},\\t \\{`, is not matched once parts are cached: the documented limit.)
      { pattern: ',\\t ', description: 'tabbed separator', severity: 'log' },
    ],
  },
});
const SECRETS = Object.freeze(['hunter2hunter2']);
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
const SYSTEM = `You are a careful agent. ${'Follow the rules. '.repeat(200)}`;

const texts = (body: Buffer) => (conversationParts(body) ?? []).map((p) => body.toString('utf8', p.start, p.end));

t.test('short elements are grouped: closed at MIN_PART_BYTES, before a long element, at the end', async (t) => {
  const short = (i: number) => JSON.stringify({ role: 'user', content: `short ${i} ${'s'.repeat(60)}` }); // 93 bytes
  const long = JSON.stringify({ role: 'user', content: 'l'.repeat(300) });
  const body = Buffer.from(
    `{"model":"m","messages":[${[0, 1, 2, 3].map(short).join(',')},${short(4)},${long},${short(5)}],"tools":[${short(6)}]}`,
  );
  t.same(texts(body), [
    [0, 1, 2].map(short).join(','), // 281 bytes: closed as it reached 256
    [3, 4].map(short).join(','), // closed before the long element
    long,
    short(5), // closed by the array's end
    short(6), // another array, another group
  ]);
  t.equal(
    skeleton(body, conversationParts(body)!).toString(),
    '{"model":"m","messages":[null,null],"tools":[null]}',
    'no element is left in the skeleton',
  );
  t.equal(MIN_PART_BYTES, 256);
  t.equal(
    conversationParts(Buffer.from(`{"model":"m","messages":[${short(0)},${short(1)}]}`)),
    null,
    'a body whose parts are all short is scanned whole',
  );
});

t.test('a conversation growing by short messages keeps its skeleton, and its closed groups', async (t) => {
  const messages: unknown[] = [{ role: 'user', content: `task ${'t'.repeat(400)}` }];
  const skeletons = new Set<string>();
  const changed: number[] = [];
  let closed: string[] = [];
  for (let turn = 0; turn < 30; turn++) {
    messages.push({ role: turn % 2 ? 'user' : 'assistant', content: turn % 2 ? 'go on' : `done step ${turn}` });
    const body = Buffer.from(JSON.stringify({ model: 'm', system: SYSTEM, messages }));
    skeletons.add(skeleton(body, conversationParts(body)!).toString());
    // Every group of the last turn but its last is in this turn as it was.
    const now = texts(body);
    if (JSON.stringify(now.slice(0, closed.length)) !== JSON.stringify(closed)) changed.push(turn);
    closed = now.slice(0, -1);
  }
  t.equal(skeletons.size, 1, 'one skeleton for all 30 turns');
  t.same(changed, [], 'no closed group changed');
  t.ok(closed.length >= 3, `groups were closed (${closed.length})`);
});

t.test('short messages: the skeleton is found in the cache, and the cache finds what a full scan finds', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const messages: unknown[] = [{ role: 'user', content: `task ${'t'.repeat(400)} mail bob@example.com` }];
  const turns = 20;
  for (let turn = 0; turn < turns; turn++) {
    messages.push({ role: 'assistant', content: turn === 7 ? 'key AKIAIOSFODNN7EXAMPLE' : `step ${turn}` });
    messages.push({ role: 'user', content: turn === 12 ? 'project-12' : 'ok' });
    const body = Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system: SYSTEM, messages }));
    const request = { body, phase: 'request' as const, policy: POLICY, secrets: SECRETS, identity: AGENT };
    same(t, await e.inspect(request), await plain.e.inspect(request), `turn ${turn}`);
  }
  // The first turn is scanned whole (first sight), the second scans the skeleton; every later one
  // finds it (it used to change every turn).
  t.equal(await metric(registry, 'dvx_inspection_cache_skeleton_hits_total'), turns - 2);
});

t.test('a group that opens with a number: the escapes of its strings are still decoded', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const long = JSON.stringify({ role: 'user', content: 'l'.repeat(300) });
  // `\u0049` hides the key from a view that does not decode JSON escapes; the group is `1,"…"`.
  for (const messages of [long, `${long},1,"deploy AKIA\\u0049OSFODNN7EXAMPLE"`]) {
    const request = {
      body: Buffer.from(`{"model":"claude-sonnet-4-5","messages":[${messages}]}`),
      phase: 'request' as const,
      policy: POLICY,
      identity: AGENT,
    };
    const want = await plain.e.inspect(request);
    same(t, await e.inspect(request), want, messages.slice(-40));
  }
  const last = await e.inspect({
    body: Buffer.from(`{"model":"claude-sonnet-4-5","messages":[${long},1,"deploy AKIA\\u0049OSFODNN7EXAMPLE"]}`),
    phase: 'request',
    policy: POLICY,
    identity: AGENT,
  });
  t.equal(last.decision, 'block', 'the key is found');
});

// Elements of every kind and size, separators of every kind: turn by turn, the cache finds what a
// scan of the whole body finds, for a conversation that grows and sometimes edits its last element.
const LEAKS = ['AKIAIOSFODNN7EXAMPLE', 'AKIA\\u0049OSFODNN7EXAMPLE', 'bob@example.com', 'hunter2hunter2', 'project-7'];
const element = fc.oneof(
  fc
    .tuple(
      fc.constantFrom('user', 'assistant'),
      fc.array(fc.oneof(fc.constantFrom(...LEAKS), fc.string({ maxLength: 30 })), { maxLength: 4 }),
    )
    .map(
      ([role, words]) =>
        `{"role":"${role}","content":"${words
          .join(' ')
          .replace(/[\\"\u0000-\u001f]/g, ' ')
          .replace(/ {2}/g, ' ')}"}`,
    ),
  fc.constantFrom(
    '1',
    'true',
    'null',
    '"ok"',
    `"${'lorem ipsum '.repeat(25)}"`,
    '[1,{"a":"AKIA\\u0049OSFODNN7EXAMPLE"}]',
  ),
  fc.constantFrom(...LEAKS).map((l) => `{"role":"user","content":"${l} ${'tool output '.repeat(25)}"}`),
);
const SEPARATORS = [',', ',', ', ', ',\n  ', ',\t '];

t.test('turn by turn, short and long elements of every kind: the cache finds what a full scan finds', async (t) => {
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const cached = engine(t, { threads: 0 });
  let turns = 0;
  let blocked = 0;
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.record({ element, separator: fc.constantFrom(...SEPARATORS), edit: fc.boolean() }), {
        minLength: 1,
        maxLength: 12,
      }),
      async (script) => {
        const list: string[] = [];
        const seps: string[] = [];
        for (const step of script) {
          // Now and then the last element is replaced (an agent's last message rewritten) rather than followed.
          if (step.edit && list.length > 1) list[list.length - 1] = step.element;
          else {
            list.push(step.element);
            seps.push(step.separator);
          }
          const messages = list.map((m, k) => (k === 0 ? m : `${seps[k]}${m}`)).join('');
          const body = Buffer.from(`{"model":"claude-sonnet-4-5","system":"s","messages":[${messages}]}`);
          const request = { body, phase: 'request' as const, policy: POLICY, secrets: SECRETS, identity: AGENT };
          const want = await plain.e.inspect(request);
          const got = await cached.e.inspect(request);
          turns++;
          if (want.decision === 'block') blocked++;
          if (!same(t, got, want, body.toString())) return false;
        }
        return true;
      },
    ),
    { numRuns: Number(process.env.CACHE_PROPERTY_RUNS ?? 150) },
  );
  t.ok(blocked > 0 && blocked < turns, `blocked and allowed turns were tried (${blocked} of ${turns})`);
  t.ok((await metric(cached.registry, 'dvx_inspection_cache_hits_total')) > 0, 'parts were reused');
});
