import t from 'tap';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { PartCache } from '../../pipeline/part-cache.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// PartCache.scanContext remembers a scan context by identity (plan, frozen secrets, variant, phase)
// instead of building it from its inputs each call: it must give exactly what context() gives, and
// a change of any input must give another context (else a part cached under the old policy or
// secrets would be believed under the new ones).

const policyOf = (severity: 'warn' | 'block') =>
  policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true, severity: 'block' },
        pii_detection: { enabled: true, severity },
      },
    }),
  );

t.test('the remembered context is context() of the same inputs, and changes with each of them', async (t) => {
  const cache = new PartCache({ maxBytes: 1 << 20 });
  const policy = policyOf('warn');
  const plan = compilePlan(policy);
  const secrets = Object.freeze(['hunter2-secret-value']);
  const list = () => ['a', 'b'];
  const first = cache.scanContext(plan, 'parts', 'request', policy.version, secrets, list);
  t.equal(first, cache.context('request', policy.version, secrets, list()));
  t.equal(cache.scanContext(plan, 'parts', 'request', policy.version, secrets, list), first, 'remembered');
  t.not(
    cache.scanContext(plan, 'parts', 'request', policy.version, secrets, () => ['a']),
    undefined,
  );
  t.not(
    cache.scanContext(plan, 'skeleton', 'request', policy.version, secrets, () => ['a', 'b', 'm']),
    first,
  );
  t.not(cache.scanContext(plan, 'parts', 'response', policy.version, secrets, list), first, 'another phase');
  const rotated = Object.freeze(['another-secret-value']);
  t.not(cache.scanContext(plan, 'parts', 'request', policy.version, rotated, list), first, 'another secret');
  t.equal(
    cache.scanContext(plan, 'parts', 'request', policy.version, Object.freeze([...secrets]), list),
    first,
    'equal secrets in another array: the same context (by content, as context() gives it)',
  );
  // An array that is not frozen may change between calls: it is hashed each time, never remembered.
  const open = ['one-secret-value'];
  const before = cache.scanContext(plan, 'parts', 'request', policy.version, open, list);
  open[0] = 'two-secret-value';
  t.not(
    cache.scanContext(plan, 'parts', 'request', policy.version, open, list),
    before,
    'a mutable array is hashed again',
  );
  // A plan handed with another policy version is not trusted for it.
  const other = policyOf('block');
  t.equal(
    cache.scanContext(plan, 'parts', 'request', other.version, secrets, list),
    cache.context('request', other.version, secrets, list()),
  );
});

t.test('through the engine: a cached part is scanned again after a policy or secret change', async (t) => {
  const engine = new InspectionEngine({ threads: 0, cacheBytes: 1 << 20 });
  t.teardown(() => engine.close());
  const identity = { agentId: 'agent-1', orgId: 'org-1', agentName: 'a' };
  const message = `reach me at someone@example.com ${'x'.repeat(300)}`;
  const body = Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: message }] }));
  const secrets = Object.freeze(['zz-not-in-the-body']);
  const warn = await engine.inspect({ body, phase: 'request', policy: policyOf('warn'), secrets, identity });
  t.equal(warn.decision, 'allow');
  t.ok(warn.findings.some((f) => f.severity === 'warn'));
  const again = await engine.inspect({ body, phase: 'request', policy: policyOf('warn'), secrets, identity });
  t.same(again.findings, warn.findings, 'cached: the same findings');
  const block = await engine.inspect({ body, phase: 'request', policy: policyOf('block'), secrets, identity });
  t.equal(block.decision, 'block', 'the new policy is applied to the resent part');
  const leaked = Object.freeze(['someone@example.com']);
  const secret = await engine.inspect({ body, phase: 'request', policy: policyOf('warn'), secrets: leaked, identity });
  t.ok(
    secret.findings.some((f) => f.severity === 'block'),
    'a new secret value is looked for in the resent part',
  );
});
