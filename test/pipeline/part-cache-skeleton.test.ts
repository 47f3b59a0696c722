import fc from 'fast-check';
import t from 'tap';
import { conversationParts, skeleton } from '../../pipeline/conversation-parts.ts';
import { engine, metric, policyOf, same } from './part-cache-fixture.ts';

// A cached turn's fixed costs (docs/decisions.md, "A cached turn's fixed costs"): the skeleton is
// cached by its own sha256 and kept the same while a conversation grows (a run of parts is kept as its
// first two), and a resent part's findings are inherited from the agent's last body under the same
// scan context. Neither may change what inspection finds: turn by turn, with policies and secrets
// changing between turns and separators of every kind between the parts, an engine with the cache
// finds exactly what an engine without it finds.

const BASE = {
  secrets_filter: { enabled: true },
  pii_detection: { enabled: true },
  api_key_detection: { enabled: true, severity: 'block' },
};
// `,\t ` is a separator style only the generator's separators use: its matches lie between parts,
// outside every part, and a skeleton that dropped the separators would lose them.
const POLICIES = [
  policyOf({
    model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
    content_inspection: {
      ...BASE,
      patterns: [
        { pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' },
        { pattern: ',\\t ', description: 'tabbed separator', severity: 'log' },
      ],
    },
  }),
  policyOf({
    content_inspection: {
      ...BASE,
      patterns: [{ pattern: 'lorem (ipsum )+dolor', description: 'filler', severity: 'block' }],
    },
  }),
];
const SECRET_SETS = [Object.freeze(['hunter2hunter2']), Object.freeze(['correct-horse-battery']), Object.freeze([])];
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };

const LEAKS = ['AKIAIOSFODNN7EXAMPLE', 'mail bob@example.com', 'hunter2hunter2', 'correct-horse-battery', 'project-7'];
const text = fc
  .array(
    fc.oneof(
      fc.constantFrom(...LEAKS),
      fc.constantFrom('lorem ipsum '.repeat(25), 'lorem ipsum dolor', 'tool output\n'.repeat(30)),
      fc.string({ maxLength: 10 }),
    ),
    { minLength: 1, maxLength: 4 },
  )
  .map((a) => a.join(' '));
const SEPARATORS = [',', ',', ', ', ',\n  ', ',\t ', ' , '];

interface Turn {
  message: string;
  separator: string;
  policy: number;
  secrets: number;
}
const turn: fc.Arbitrary<Turn> = fc.record({
  message: text,
  separator: fc.constantFrom(...SEPARATORS),
  policy: fc.nat(POLICIES.length - 1),
  secrets: fc.nat(SECRET_SETS.length - 1),
});

function bodyAt(system: string, turns: readonly Turn[], model: string): Buffer {
  let list = '';
  turns.forEach((x, k) => {
    const m = JSON.stringify({ role: k % 2 ? 'assistant' : 'user', content: x.message });
    list += k === 0 ? m : `${x.separator}${m}`;
  });
  return Buffer.from(`{"model":${JSON.stringify(model)},"system":${JSON.stringify(system)},"messages":[${list}]}`);
}

t.test('a run of parts is kept as its first two; every other byte stays', async (t) => {
  // `ok` is short: a part of its own, closed by the long element after it (conversation-parts.ts).
  const m = (c: string) => JSON.stringify({ role: 'user', content: c.repeat(300) });
  const body = Buffer.from(
    `{"model":"m","messages":[${m('a')},${m('b')},${m('c')}, ${m('d')}, ${m('e')}, ${m('f')},{"role":"user","content":"ok"},${m('g')}],"tools":[${m('t')},${m('u')},${m('v')}]}`,
  );
  const parts = conversationParts(body)!;
  t.equal(parts.length, 11);
  t.equal(
    skeleton(body, parts).toString(),
    '{"model":"m","messages":[null,null, null,null],"tools":[null,null]}',
    'a run with one separator keeps two; another separator starts a new pair; the gap between arrays stays',
  );
  // The skeleton of a growing conversation stays the same once it holds two parts.
  const grown = (n: number) =>
    Buffer.from(`{"model":"m","system":"s","messages":[${Array.from({ length: n }, (_, i) => m(`${i}`)).join(',')}]}`);
  const first = skeleton(grown(2), conversationParts(grown(2))!).toString();
  for (const n of [3, 10, 40])
    t.equal(skeleton(grown(n), conversationParts(grown(n))!).toString(), first, `${n} parts`);
});

t.test('a growing conversation: its skeleton is scanned once, then found in the cache', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const messages: unknown[] = [];
  for (let i = 0; i < 6; i++) {
    messages.push({ role: i % 2 ? 'assistant' : 'user', content: `turn ${i} ${'lorem ipsum '.repeat(30)}` });
    // The system prompt holds a finding: it counts on every turn, scanned or not.
    const body = Buffer.from(
      JSON.stringify({ model: 'claude-sonnet-4-5', system: 'write to bob@example.com', messages }),
    );
    const request = { body, phase: 'request' as const, policy: POLICIES[0], identity: AGENT };
    const got = await e.inspect(request);
    same(t, got, await plain.e.inspect(request), `turn ${i}`);
    t.same(
      got.findings.map((f) => f.inspector_type),
      ['pii'],
      `turn ${i}: the system prompt's finding`,
    );
  }
  // Turn 0 (one part) and turn 1 (the pair) scan theirs; from then on the skeleton is the same.
  t.equal(await metric(registry, 'dvx_inspection_cache_skeleton_hits_total'), 4);
  // Another model, another skeleton: model restriction reads it.
  const denied = await e.inspect({
    body: Buffer.from(JSON.stringify({ model: 'gpt-3.5-turbo', system: 'write to bob@example.com', messages })),
    phase: 'request',
    policy: POLICIES[0],
    identity: AGENT,
  });
  t.equal(denied.decision, 'block', 'the new model is checked');
});

t.test(
  'turn by turn, with policies, secrets and separators changing, the cache finds what a full scan finds',
  async (t) => {
    const plain = engine(t, { threads: 0, cacheBytes: 0 });
    const cached = engine(t, { threads: 0 });
    let blocked = 0;
    let turns = 0;
    await fc.assert(
      fc.asyncProperty(text, fc.array(turn, { minLength: 1, maxLength: 8 }), async (system, script) => {
        for (let k = 1; k <= script.length; k++) {
          const now = script[k - 1];
          const model = k % 5 === 4 ? 'gpt-3.5-turbo' : 'claude-sonnet-4-5';
          const request = {
            body: bodyAt(system, script.slice(0, k), model),
            phase: 'request' as const,
            policy: POLICIES[now.policy],
            secrets: SECRET_SETS[now.secrets],
            identity: AGENT,
          };
          const want = await plain.e.inspect(request);
          const got = await cached.e.inspect(request);
          turns++;
          if (want.decision === 'block') blocked++;
          if (!same(t, got, want, `turn ${k} of ${request.body.toString()}`)) return false;
        }
        return true;
      }),
      { numRuns: Number(process.env.CACHE_PROPERTY_RUNS ?? 150) },
    );
    t.ok(blocked > 0 && blocked < turns, `blocked and allowed turns were tried (${blocked} of ${turns})`);
    t.ok((await metric(cached.registry, 'dvx_inspection_cache_skeleton_hits_total')) > 0, 'skeletons were reused');
    t.ok((await metric(cached.registry, 'dvx_inspection_cache_hits_total')) > 0, 'parts were reused');
  },
);

t.test('an inherited part is re-checked under a new policy or new secrets', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const old = { role: 'user', content: `lorem ipsum dolor, and hunter2hunter2 ${'tool output '.repeat(30)}` };
  const reply = { role: 'assistant', content: 'noted '.repeat(60) };
  const body = (messages: unknown[]) =>
    Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system: 's', messages }));
  const first = await e.inspect({ body: body([old]), phase: 'request', policy: POLICIES[0], identity: AGENT });
  t.equal(first.decision, 'allow');
  const stricter = await e.inspect({
    body: body([old, reply]),
    phase: 'request',
    policy: POLICIES[1],
    identity: AGENT,
  });
  t.equal(stricter.decision, 'block', 'the new policy finds the filler in the resent part');
  const secret = await e.inspect({
    body: body([old, reply, reply]),
    phase: 'request',
    policy: POLICIES[1],
    secrets: SECRET_SETS[0],
    identity: AGENT,
  });
  t.ok(
    secret.findings.some((f) => f.inspector_type === 'secrets'),
    'a new secret value is found in the resent part',
  );
});
