import t from 'tap';
import { compilePlan, PlanCache } from '../../pipeline/plan.ts';
import { pooledPolicy, readPooledPolicy as readBack } from '../../pipeline/pooled-policy.ts';
import { engine, policyOf } from './part-cache-fixture.ts';

// A policy crosses to the pool's workers once per version (pooled-policy.ts): a task carries the
// version and the policy's bytes in shared memory, and a worker reads them only to compile a plan of a
// version it has not seen. What the workers find must follow the policy each call names, version by
// version, as the inline scan does.

const doc = (pattern: string, severity = 'block') => ({
  content_inspection: {
    pii_detection: { enabled: true },
    patterns: [{ pattern, description: `codename ${pattern}`, severity }],
  },
});

t.test('a policy is made into shared bytes once, read back whole, again when its version changes', async (t) => {
  const policy = policyOf(doc('project-[0-9]+'));
  const pooled = pooledPolicy(policy);
  t.equal(pooledPolicy(policy), pooled, 'the same policy: the same bytes, not serialized again');
  t.ok(pooled.bytes.buffer instanceof SharedArrayBuffer, 'in shared memory: a message shares it');
  t.equal(pooled.version, policy.version);
  t.same(readBack(pooled), policy, 'read back, it is the policy');

  const changed = { ...policy, version: `${policy.version}-next` };
  t.not(pooledPolicy(changed), pooled, 'another object: its own bytes');
  (policy as { version: string }).version = `${policy.version}-edited`;
  t.not(pooledPolicy(policy), pooled, 'the same object with another version: made again');
  t.equal(pooledPolicy(policy).version, policy.version);
});

t.test('a worker`s plan cache compiles a pooled policy once per version', async (t) => {
  const plans = new PlanCache();
  const a = policyOf(doc('alpha-[0-9]+'));
  const b = policyOf(doc('beta-[0-9]+'));
  const planA = plans.getPooled(pooledPolicy(a));
  t.same(planA.version, compilePlan(a).version);
  t.equal(plans.getPooled(pooledPolicy(a)), planA, 'the same version: the same plan');
  t.not(plans.getPooled(pooledPolicy(b)), planA, 'another version: another plan');
  t.equal(plans.get(a), planA, 'and the policy itself finds the plan its bytes made');
});

t.test('the pool finds what each call`s policy names, version after version', async (t) => {
  const { e } = engine(t, { threads: 2, inlineThresholdBytes: 0 });
  const inline = engine(t, { threads: 0 });
  const policies = [policyOf(doc('alpha-[0-9]+')), policyOf(doc('beta-[0-9]+')), policyOf(doc('alpha-[0-9]+', 'warn'))];
  const text = 'alpha-12 and beta-34 and bob@example.com';
  const body = Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: text }] }));
  const seen: string[] = [];
  // Each policy several times, interleaved, so each worker meets each version after another.
  for (let round = 0; round < 4; round++)
    for (const policy of policies) {
      const request = { body, phase: 'request' as const, policy };
      const pooled = await e.inspect(request);
      const want = await inline.e.inspect(request);
      t.equal(pooled.mode, 'pool');
      t.equal(pooled.decision, want.decision);
      t.same(pooled.findings.map((f) => f.description).sort(), want.findings.map((f) => f.description).sort());
      if (round === 0) seen.push(`${pooled.decision}: ${pooled.findings.map((f) => f.description).sort()}`);
    }
  t.same(seen, [
    'block: codename alpha-[0-9]+,email address',
    'block: codename beta-[0-9]+,email address',
    'allow: codename alpha-[0-9]+,email address',
  ]);
});
