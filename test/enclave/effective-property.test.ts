import t from 'tap';
import fc from 'fast-check';
import { join } from 'node:path';
import { createLogger } from '../../core/logger.ts';
import { compile, permitted } from '../../pipeline/inspectors/model-restriction.ts';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { startPuller } from '../../enclave/pullers/puller.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { PLATFORM_KEY, startHarness } from '../fixtures/llmproxy-harness.ts';

// Property: for any model policies authored at platform, org and agent scope (locked or not), the
// effective policy the API shows is what the running proxy enforces — every probe model the effective
// policy permits is served, every other one refused — once the enclave has converged.
const cph = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => cph.close());
const call = (method: string, path: string, body?: unknown) => cph.call('root', method, path, body);
const proxy = await startHarness({ secrets: { 'agent:bot-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY } } });
t.teardown(() => proxy.close());
await call('POST', '/orgs', { id: 'org-a', name: 'A' });
const reg = await call('POST', '/enclaves', { name: 'e', enclave_id: 'enc-1', owning_org: 'org-a' });
await call('POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1' });
await call('PUT', '/platform/config/llmproxy/downstream_url', { value: JSON.stringify(proxy.upstream.url) });
const puller = startPuller({
  controlplane: `https://127.0.0.1:${cph.cp.port}`,
  route: '/v1/broker/snapshot',
  brokerToken: reg.body.key.token,
  out: join(proxy.dir, 'snapshot.json'),
  intervalMs: 60_000,
  events: true,
  insecureSkipVerify: true,
  validate: (d) => void validateSnapshot(d),
  log: createLogger({ level: 'error', destination: { write: () => {} } }),
});
t.teardown(() => puller.close());
await puller.ready;

const MODELS = ['claude-a', 'claude-b', 'gpt-a', 'o1'];
const GLOBS = ['claude-*', 'gpt-*', 'claude-a', 'o?', '*'];
const policy = fc.option(
  fc.record({
    mode: fc.constantFrom('allowlist', 'blocklist'),
    models: fc.subarray(GLOBS, { minLength: 1 }),
    locked: fc.boolean(),
  }),
  { nil: null },
);

async function served(model: string): Promise<boolean> {
  const client = proxy.anthropic(await proxy.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'b', group_id: null }));
  try {
    await client.messages.create({ model, max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
    return true;
  } catch (err) {
    if ((err as { status?: number }).status !== 403) throw err;
    return false;
  }
}

t.test('effective policy = enforced policy', async (t) => {
  await fc.assert(
    fc.asyncProperty(policy, policy, policy, async (platform, org, agent) => {
      const write = async (path: string, p: typeof platform, lockable: boolean) => {
        if (p === null) return void (await call('DELETE', path));
        await call('PUT', path, {
          value: JSON.stringify({ mode: p.mode, models: p.models }),
          ...(lockable ? { locked: p.locked } : {}),
        });
      };
      await call('DELETE', '/agents/bot-1/config/model_policy');
      await write('/platform/config/llmproxy/model_policy', platform, true);
      // The org route writes for the caller's org: root's token is of org-a.
      await write('/config/llmproxy/model_policy', org, true);
      if (agent)
        await call('POST', '/agents/bot-1/config', {
          override_service: 'llmproxy',
          key: 'model_policy',
          value: JSON.stringify({ mode: agent.mode, models: agent.models }),
        });
      const effective = (await call('GET', '/agents/bot-1/effective-policy')).body;
      const plan = compile(effective.policy.models);
      const expected = MODELS.map((m) => (plan ? permitted(plan, m) : true));
      // Converged when the proxy agrees; it must within a few seconds.
      let actual: boolean[] = [];
      for (let i = 0; i < 60; i++) {
        actual = [];
        for (const m of MODELS) actual.push(await served(m));
        if (JSON.stringify(actual) === JSON.stringify(expected)) return;
        await new Promise((r) => setTimeout(r, 100));
      }
      t.same(
        actual,
        expected,
        `platform ${JSON.stringify(platform)} org ${JSON.stringify(org)} agent ${JSON.stringify(agent)}`,
      );
      throw new Error('the proxy did not converge on the effective policy');
    }),
    { numRuns: 12, seed: Number(process.env.DVX_PROPERTY_SEED ?? Date.now() % 100000) },
  );
  t.pass('12 random authorings converged to what the API shows');
});
