import t from 'tap';
import { join } from 'node:path';
import { createLogger } from '../../core/logger.ts';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { startPuller, type RunningPuller } from '../../enclave/pullers/puller.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { PLATFORM_KEY, startHarness } from '../fixtures/llmproxy-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// End to end on real parts: the control plane on PostgreSQL, the policy puller writing the snapshot a
// running llmproxy reads, and an agent calling through the official SDK. Each operator write shows in
// the proxy's behaviour within seconds (the nudge), without a restart; with events off, within one
// interval.
const pgDb = await freshPgDatabase('dvx_converge');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
const dsn = pgDb?.dsn;
if (pgDb) t.teardown(() => pgDb.drop());

const cph = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => cph.close());
const cp = await cph.start({ seedAdmin: ['root'], ...(dsn ? { databaseDsn: dsn } : {}) });
t.teardown(() => cp.close());
const call = (who: string, method: string, path: string, body?: unknown) =>
  cph.callAt(cp.port, who, method, path, body);

const proxy = await startHarness({ secrets: { 'agent:bot-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY } } });
t.teardown(() => proxy.close());

await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', capability: 'platform:config' });
const registered = await call('root', 'POST', '/enclaves', {
  name: 'eu-prod',
  enclave_id: 'enc-1',
  owning_org: 'org-a',
});
const brokerToken = registered.body.key.token as string;
await call('admin-a', 'POST', '/orgs/org-a/agents', {
  uid: 'bot-1',
  name: 'builder',
  group: 'ops',
  enclave_id: 'enc-1',
});
await call('root', 'PUT', '/platform/config/llmproxy/downstream_url', { value: JSON.stringify(proxy.upstream.url) });

const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const snapshotPath = join(proxy.dir, 'snapshot.json');
function puller(events: boolean, intervalMs: number): RunningPuller {
  return startPuller({
    controlplane: `https://127.0.0.1:${cp.port}`,
    route: '/v1/broker/snapshot',
    brokerToken,
    out: snapshotPath,
    intervalMs,
    events,
    insecureSkipVerify: true,
    validate: (doc) => void validateSnapshot(doc),
    log: quiet,
  });
}

const agentToken = () => proxy.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'builder', group_id: 'ops' });
async function ask(model: string, text = 'hello'): Promise<number> {
  const client = proxy.anthropic(await agentToken());
  try {
    await client.messages.create({ model, max_tokens: 16, messages: [{ role: 'user', content: text }] });
    return 200;
  } catch (err) {
    return (err as { status?: number }).status ?? 0;
  }
}
/** Milliseconds until `check` holds (polling), or fails the test after `ms`. */
async function within(ms: number, check: () => Promise<boolean>): Promise<number> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return Date.now() - start;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`not converged within ${ms} ms`);
}

t.test('with events: every write reaches the proxy within seconds', async (t) => {
  const p = puller(true, 60_000);
  t.teardown(() => p.close());
  await p.ready;
  t.equal(await ask('claude-x'), 200, 'the agent is served');

  const blocked = await call('admin-a', 'PUT', '/config/llmproxy/model_policy', {
    value: JSON.stringify({ mode: 'blocklist', models: ['claude-x'] }),
  });
  t.equal(blocked.body.published, true, 'published to the enclave');
  const ms = await within(5000, async () => (await ask('claude-x')) === 403);
  t.pass(`a blocked model is refused ${ms} ms after the write`);
  t.equal(await ask('claude-y'), 200, 'other models still pass');

  await call('admin-a', 'PUT', '/config/llmproxy/content_inspection', {
    value: JSON.stringify({ pii_detection: { enabled: true, severity: 'block', types: ['email'] } }),
  });
  await within(5000, async () => (await ask('claude-y', 'write to jane.doe@example.com')) === 403);
  t.equal(await ask('claude-y', 'no personal data here'), 200);

  // A lock at org scope: the agent override is refused at the API, and the proxy keeps the org's rule.
  await call('admin-a', 'PUT', '/config/llmproxy/model_policy', {
    value: JSON.stringify({ mode: 'blocklist', models: ['claude-x'] }),
    locked: true,
  });
  t.equal(
    (
      await call('admin-a', 'POST', '/agents/bot-1/config', {
        override_service: 'llmproxy',
        key: 'model_policy',
        value: JSON.stringify({ mode: 'allowlist', models: ['claude-*'] }),
      })
    ).status,
    409,
  );
  t.equal(await ask('claude-x'), 403);

  await call('admin-a', 'PUT', '/feature-flags/inspect:llm', { enabled: false });
  await within(5000, async () => (await ask('claude-x')) === 200);
  t.pass('inspect:llm off: the whole pipeline is skipped');
  await call('admin-a', 'PUT', '/feature-flags/inspect:llm', { enabled: true });
  await within(5000, async () => (await ask('claude-x')) === 403);

  // A pack with LLM policy, installed at the org: its rules add on top of the base.
  await call('root', 'POST', '/packs', {
    name: 'no-cards',
    config: { content_inspection: { pii_detection: { enabled: true, severity: 'block', types: ['credit_card'] } } },
  });
  t.equal(await ask('claude-y', 'card 4111 1111 1111 1111'), 200, 'before the pack');
  t.equal((await call('root', 'PUT', '/packs/no-cards/installations?scope=org&org=org-a')).body.published, true);
  await within(5000, async () => (await ask('claude-y', 'card 4111 1111 1111 1111')) === 403);
  t.equal(await ask('claude-y', 'write to jane.doe@example.com'), 403, 'the base rule still holds');
  await call('root', 'DELETE', '/packs/no-cards/installations?scope=org&org=org-a');
  await within(5000, async () => (await ask('claude-y', 'card 4111 1111 1111 1111')) === 200);

  // Containment and suspension refuse the agent's calls.
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/suspend');
  await within(5000, async () => (await ask('claude-y')) === 403);
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore');
  await within(5000, async () => (await ask('claude-y')) === 200);
});

t.test('the effective policy the API shows is what the proxy enforces', async (t) => {
  const effective = (await call('admin-a', 'GET', '/agents/bot-1/effective-policy')).body;
  t.same(effective.policy.models, [{ mode: 'blocklist', models: ['claude-x'], immutable: false }]);
  t.equal(effective.policy.content.pii_detection.enabled, true);
  t.equal(effective.downstream_url, proxy.upstream.url);
});

t.test('with events off: within one interval', async (t) => {
  const p = puller(false, 400);
  t.teardown(() => p.close());
  await p.ready;
  await call('admin-a', 'PUT', '/config/llmproxy/model_policy', {
    value: JSON.stringify({ mode: 'blocklist', models: ['claude-z'] }),
  });
  const ms = await within(3000, async () => (await ask('claude-z')) === 403);
  t.ok(ms < 3000, `refused ${ms} ms after the write (interval 400 ms)`);
  t.equal(await ask('claude-x'), 200);
});
