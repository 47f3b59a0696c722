import t from 'tap';
import { WORST_CASES, WORST_PATTERNS, WORST_SECRET, combinedWorstBody, worstBody } from '../../bench/worst-case.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { scanBody } from '../../pipeline/scan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// Each inspector's worst case (bench/worst-case.ts), a few MB of it, scans to the end and still finds
// the real hit after the padding (the speed is in the benchmark, never asserted here).

const CONTENT = {
  secrets_filter: { enabled: true, severity: 'block' },
  pii_detection: { enabled: true, severity: 'warn' },
  api_key_detection: { enabled: true, severity: 'block' },
  patterns: WORST_PATTERNS,
};
const policyOf = (content: Record<string, unknown>) =>
  policyFromDocument(validatePolicyDocument({ content_inspection: content }));
const ALONE = {
  pii: compilePlan(policyOf({ pii_detection: CONTENT.pii_detection })),
  api_key: compilePlan(policyOf({ api_key_detection: CONTENT.api_key_detection })),
  secrets: compilePlan(policyOf({ secrets_filter: CONTENT.secrets_filter })),
  patterns: compilePlan(policyOf({ patterns: WORST_PATTERNS })),
};

for (const c of WORST_CASES) {
  t.test(`${c.inspector}: ${c.name}`, async (t) => {
    const body = worstBody(c, 3 * 1024 * 1024);
    const out = scanBody(ALONE[c.inspector], { body, phase: c.phase, secrets: [WORST_SECRET] });
    t.same(
      out.failures.map((f) => `${f.inspector}:${f.reason}`),
      c.failures ?? [],
    );
    t.same(out.findings.map((f) => `${f.inspector_type}:${f.match}`).sort(), c.expect);
  });
}

t.test('every worst case in one 32 MB body, through the engine: it finishes, and the hits are found', async (t) => {
  // (How long it takes against the default deadline is the benchmark's to say, on a quiet machine.)
  const e = new InspectionEngine({ timeoutMs: 120_000 });
  t.teardown(() => e.close());
  const policy = policyOf(CONTENT);
  const body = combinedWorstBody(32 * 1024 * 1024 - 4096);
  // A first pooled run starts the pool's thread (slow on a loaded machine); the second is the one checked.
  await e.inspect({ body: worstBody(WORST_CASES[0], 256 * 1024), phase: 'request', policy, secrets: [WORST_SECRET] });
  const out = await e.inspect({ body, phase: 'request', policy, secrets: [WORST_SECRET] });
  t.same(out.failures, []);
  t.equal(out.decision, 'block');
  const found = new Set(out.findings.map((f) => f.inspector_type));
  t.same([...found].sort(), ['api_key', 'patterns', 'pii', 'secrets']);
});

t.test('the padding attack at engine level: card near misses, then a secret and a key', async (t) => {
  const e = new InspectionEngine();
  t.teardown(() => e.close());
  const policy = policyOf(CONTENT);
  const content =
    '4111 1111 1111 111 '.repeat(Math.ceil((24 * 1024 * 1024) / 19)) +
    ` password ${WORST_SECRET} key AKIAIOSFODNN7EXAMPLE`;
  const body = Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content }] }));
  await e.inspect({ body: worstBody(WORST_CASES[0], 256 * 1024), phase: 'request', policy, secrets: [WORST_SECRET] });
  const out = await e.inspect({ body, phase: 'request', policy, secrets: [WORST_SECRET] });
  t.same([out.decision, out.failOpen, out.failures], ['block', false, []]);
  t.same(out.findings.map((f) => `${f.inspector_type}:${f.severity}`).sort(), ['api_key:block', 'secrets:block']);
});
