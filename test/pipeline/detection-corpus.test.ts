import t from 'tap';
import { compilePlan } from '../../pipeline/plan.ts';
import { scanBody } from '../../pipeline/scan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { CASES, SECRETS } from '../fixtures/detection-corpus.ts';

// The detection corpus (test/fixtures/detection-corpus.ts): every case, with the custom pattern (whose
// RE2.Set pass also prefilters the built-ins) and without it (every built-in runs), must report exactly
// the inspector types it expects.
const content = {
  secrets_filter: { enabled: true },
  pii_detection: { enabled: true },
  api_key_detection: { enabled: true },
};
const withPattern = compilePlan(
  policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        ...content,
        patterns: [{ pattern: '(?i)project\\s+nightingale', description: 'codename', severity: 'block' }],
      },
    }),
  ),
);
const withoutPattern = compilePlan(policyFromDocument(validatePolicyDocument({ content_inspection: content })));

for (const [name, plan, patterns] of [
  ['with a custom pattern', withPattern, true],
  ['built-ins alone', withoutPattern, false],
] as const) {
  t.test(`${CASES.length} cases, ${name}`, async (t) => {
    for (const c of CASES) {
      const body = Buffer.isBuffer(c.body) ? c.body : Buffer.from(c.body);
      const result = scanBody(plan, { body, phase: c.phase, secrets: SECRETS });
      const got = [...new Set(result.findings.map((f) => f.inspector_type))].sort();
      const expected = c.expect.filter((e) => patterns || e !== 'patterns').sort();
      t.same(
        { got, failures: result.failures },
        { got: expected, failures: [] },
        `${c.phase} ${c.id}${c.note ? ` (${c.note})` : ''}`,
      );
    }
  });
}

t.test('no finding ever carries a secret value', async (t) => {
  for (const c of CASES) {
    const body = Buffer.isBuffer(c.body) ? c.body : Buffer.from(c.body);
    const text = JSON.stringify(scanBody(withPattern, { body, phase: c.phase, secrets: SECRETS }).findings);
    for (const secret of SECRETS.filter((s) => [...s].length >= 8))
      t.notOk(text.includes(secret), `${c.id}: ${secret.slice(0, 4)}…`);
  }
});
