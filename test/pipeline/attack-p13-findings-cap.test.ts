import t from 'tap';
import { InspectionEngine, type InspectionOutcome } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// Attack on the per-part cache's merge of findings (engine.ts, FindingSet): one scan shares its 64
// findings per inspector out per pattern, so a `block` pattern always reports (patterns.ts, scan).
// The cache merges several scans (skeleton, cached parts, new parts) and used to keep the first 64
// per inspector: a skeleton stuffed with 64 distinct matches of a `log` pattern pushed a cached or
// new part's `block` finding out of the outcome, and the call went through. An engine without the
// cache (the oracle) blocks it.

const policy = policyFromDocument(
  validatePolicyDocument({
    content_inspection: {
      patterns: [
        { pattern: '[0-9]{4}-ticket', description: 'ticket', severity: 'log' },
        { pattern: 'launch code [a-z]{6}', description: 'launch', severity: 'block' },
      ],
    },
  }),
);
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
const pad = 'lorem ipsum '.repeat(30);
const tickets = Array.from({ length: 80 }, (_, i) => `${String(1000 + i)}-ticket`).join(' ');

const body = (system: string, messages: string[]) =>
  Buffer.from(
    JSON.stringify({
      model: 'claude-x',
      system,
      messages: messages.map((content, i) => ({ role: i % 2 ? 'assistant' : 'user', content })),
    }),
  );

const blockedBy = (o: InspectionOutcome) => o.findings.filter((f) => f.severity === 'block').map((f) => f.description);

for (const threads of [0, 2]) {
  t.test(
    `a cached block finding is not crowded out by a skeleton full of log matches (threads ${threads})`,
    async (t) => {
      const cached = new InspectionEngine({ threads, adaptiveOffload: null });
      const oracle = new InspectionEngine({ threads, adaptiveOffload: null, cacheBytes: 0 });
      t.teardown(() => Promise.all([cached.close(), oracle.close()]));
      const inspect = (e: InspectionEngine, b: Buffer) =>
        e.inspect({ body: b, phase: 'request', policy, identity: AGENT });

      // Turn 1: the leak is refused, and its part's finding is stored.
      const first = body('be helpful', [`${pad} launch code abcdef ${pad}`]);
      t.equal((await inspect(cached, first)).decision, 'block');
      // Turn 2: the same message resent, the system prompt now full of distinct log matches.
      const second = body(`be helpful ${tickets}`, [`${pad} launch code abcdef ${pad}`]);
      const want = await inspect(oracle, second);
      t.equal(want.decision, 'block', 'the oracle blocks');
      const got = await inspect(cached, second);
      t.equal(got.decision, 'block', 'the cache blocks too');
      t.same(blockedBy(got), ['launch']);
    },
  );

  t.test(`a new part's block finding is not crowded out by cached log matches (threads ${threads})`, async (t) => {
    // Large enough that, with a pool, the skeleton and the new parts are scanned apart.
    const big = 'tool output '.repeat(12_000);
    const cached = new InspectionEngine({ threads, adaptiveOffload: null });
    const oracle = new InspectionEngine({ threads, adaptiveOffload: null, cacheBytes: 0 });
    t.teardown(() => Promise.all([cached.close(), oracle.close()]));
    const inspect = (e: InspectionEngine, b: Buffer) =>
      e.inspect({ body: b, phase: 'request', policy, identity: AGENT });

    const turn1 = [`${pad} ${tickets}`, big];
    t.equal((await inspect(cached, body('be helpful', turn1))).decision, 'allow');
    const turn2 = body('be helpful', [...turn1, `${big} launch code abcdef`]);
    t.equal((await inspect(oracle, turn2)).decision, 'block', 'the oracle blocks');
    const got = await inspect(cached, turn2);
    t.equal(got.decision, 'block', 'the cache blocks too');
    t.same(blockedBy(got), ['launch']);
  });
}
