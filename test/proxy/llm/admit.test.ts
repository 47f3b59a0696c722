import t from 'tap';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The admit step: an enclave below --min-tier is refused.

t.test('--min-tier refuses enclaves below it', async (t) => {
  const tier = await startHarness({ proxy: { minTier: 'per-agent-tee' } });
  t.teardown(() => tier.close());
  const r = await post(tier, '/v1/messages', anthropicBody('hi'));
  t.equal(r.status, 403);
  t.match(JSON.parse(r.text), { error: { message: /isolation class/ } });
});
