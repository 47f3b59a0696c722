import t from 'tap';
import { join } from 'node:path';
import { createLogger } from '../../core/logger.ts';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { startPuller } from '../../enclave/pullers/puller.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { PLATFORM_KEY, startHarness } from '../fixtures/llmproxy-harness.ts';

// The governance llm_policy authored through the control plane (PUT /api/v1/policies/llm) reaches a
// running llmproxy through the puller and is enforced (models, and tool calls by its inspection); a
// delete lifts it.
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

const MODELS = ['claude-a', 'claude-b', 'gpt-a'];
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
/** Waits (a few seconds at most) until the proxy serves exactly the models expected. */
async function converges(expected: boolean[]): Promise<boolean[]> {
  let actual: boolean[] = [];
  for (let i = 0; i < 60; i++) {
    actual = [];
    for (const m of MODELS) actual.push(await served(m));
    if (JSON.stringify(actual) === JSON.stringify(expected)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return actual;
}

t.test('authored, pulled, enforced, lifted', async (t) => {
  t.same(await converges([true, true, true]), [true, true, true], 'no policy: every model');
  t.equal((await call('PUT', '/policies/llm?scope=org&org=org-a', { models: { deny: ['gpt-*'] } })).status, 200);
  t.same(await converges([true, true, false]), [true, true, false], "the org's deny");
  t.match(proxy.audit.at(-1), {
    agent_id: 'bot-1',
    model: 'gpt-a',
    status: 403,
    decision: 'deny',
    error: 'llm_policy: model "gpt-a" matches deny glob "gpt-*"',
  });
  t.equal(
    (await call('PUT', '/policies/llm?scope=agent&agent=bot-1', { models: { allow: ['claude-b'] } })).status,
    200,
  );
  t.same(await converges([false, true, false]), [false, true, false], "the agent's allow list is one more gate");
  t.equal((await call('DELETE', '/policies/llm?scope=org&org=org-a')).status, 204);
  t.equal((await call('DELETE', '/policies/llm?scope=agent&agent=bot-1')).status, 204);
  t.same(await converges([true, true, true]), [true, true, true], 'lifted');
});

t.test('a tool policy authored, pulled, enforced on tool calls, lifted', async (t) => {
  const token = await proxy.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'b', group_id: null });
  const client = proxy.anthropic(token).withOptions({
    defaultHeaders: {
      'x-test-tools': JSON.stringify([
        { name: 'get_weather', input: { city: 'Oslo' } },
        { name: 'delete_file', input: { path: '/srv' } },
      ]),
    },
  });
  const ask = () =>
    client.messages.create({ model: 'claude-a', max_tokens: 8, messages: [{ role: 'user', content: 'go' }] });
  const kinds = async () => (await ask()).content.map((b) => b.type).join(',');
  /** Waits (a few seconds at most) until the agent receives the blocks expected. */
  const converges = async (expected: string) => {
    let actual = '';
    for (let i = 0; i < 60 && actual !== expected; i++) {
      actual = await kinds();
      if (actual !== expected) await new Promise((r) => setTimeout(r, 100));
    }
    return actual;
  };
  t.equal(await converges('tool_use,tool_use'), 'tool_use,tool_use', 'no tool policy: both calls');
  const policy = {
    inspection: {
      inspectors: [{ name: 'ops', rules: [{ tool: 'delete_*', verdict: 'deny', summary: 'No deletions' }] }],
    },
  };
  t.equal((await call('PUT', '/policies/llm?scope=org&org=org-a', policy)).status, 200);
  t.equal(await converges('tool_use,text'), 'tool_use,text', 'the denied call refused once pulled');
  const msg = await ask();
  t.match(msg.content[0], { type: 'tool_use', name: 'get_weather' });
  t.equal(
    msg.content[1].type === 'text' && msg.content[1].text,
    '[dvx] The tool call delete_file (id toolu_2) was not run: denied by rule ops.rules[0] (No deletions).',
  );
  const rows = proxy.audit.filter((r) => r.table === 'tool_call_decisions' && r.tool === 'delete_file');
  t.match(rows.at(-1), {
    org_id: 'org-a',
    agent_id: 'bot-1',
    verdict: 'deny',
    outcome: 'deny',
    decided_by: 'policy',
    rule: 'ops.rules[0]',
    inspector: 'ops',
    policy_version: /^[0-9a-f]{16}$/,
  });
  t.equal((await call('DELETE', '/policies/llm?scope=org&org=org-a')).status, 204);
  t.equal(await converges('tool_use,tool_use'), 'tool_use,tool_use', 'lifted');
});
