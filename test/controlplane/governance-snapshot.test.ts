import t from 'tap';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { snapshotGovernance } from '../../pipeline/policy/snapshot-governance.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Governance authored through /api/v1/policies/{kind} and packs reach the snapshot an enclave pulls
// (GET /v1/broker/snapshot) at the scope they were authored at, and what the enclave resolves from it
// is what the effective-governance read answers.
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => h.close());
const call = (method: string, path: string, body?: unknown) => h.call('root', method, path, body);
await call('POST', '/orgs', { id: 'org-a', name: 'A' });
await call('POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
const reg = await call('POST', '/enclaves', { name: 'e', enclave_id: 'enc-1', owning_org: 'org-a' });
const brokerKey: string = reg.body.key.token;
await call('POST', '/packs', { name: 'no-paste', deny: [{ host: 'pastebin.com' }] });
await call('POST', '/packs', { name: 'corp-only', allow: [{ cidr: '10.0.0.0/8' }] });
await call('POST', '/packs', {
  name: 'lab',
  allow: [{ host: '*.lab' }],
  config: { model_policy: { mode: 'blocklist', models: ['*-mini'] } },
});
await call('POST', '/orgs/org-a/agents', {
  uid: 'bot-1',
  name: 'b',
  enclave_id: 'enc-1',
  group: 'ops',
  policy_packs: ['lab'],
});

async function snapshot() {
  const res = await h.rawAt(h.cp.port, 'GET', '/v1/broker/snapshot', undefined, {
    authorization: `Bearer ${brokerKey}`,
  });
  t.equal(res.status, 200);
  return JSON.parse(res.text);
}

t.test('PUT /api/v1/policies/llm reaches the snapshot at its scope', async (t) => {
  const orgLlm = {
    models: { allow: ['claude-*'], deny: ['claude-2*'] },
    providers: { allow: ['anthropic'] },
    inspection: {
      inspectors: [{ name: 'pay', rules: [{ tool: 'pay_*', verdict: 'deny', model_match: 'claude-*' }] }],
    },
  };
  t.equal((await call('PUT', '/policies/llm?scope=org&org=org-a', { ...orgLlm, locked: true })).status, 200);
  t.equal(
    (
      await call('PUT', '/policies/llm', {
        credential_mode: 'passthrough',
        upstream: { anthropic: 'https://llm.internal/' },
      })
    ).status,
    200,
  );
  t.equal((await call('PUT', '/policies/tunnel-ports?scope=group&org=org-a&group=ops', { ports: [443] })).status, 200);
  t.equal((await call('PUT', '/policies/exec?scope=agent&agent=bot-1', { enabled: true })).status, 200);
  t.equal((await call('PUT', '/packs/no-paste/installations?scope=org&org=org-a')).status, 200);
  t.equal((await call('PUT', '/packs/corp-only/installations?scope=group&org=org-a&group=ops')).status, 200);

  const doc = await snapshot();
  t.same(doc.skipped, []);
  t.same(doc.orgs['org-a'].config.llm_policy, {
    value: { ...orgLlm, models: orgLlm.models, providers: { allow: ['anthropic'], deny: [] } },
    locked: true,
  });
  t.same(doc.platform.llm_policy, {
    value: { credential_mode: 'passthrough', upstream: { anthropic: 'https://llm.internal' } },
    locked: false,
  });
  t.same(doc.orgs['org-a'].groups.ops, {
    config: { tunnel_ports_policy: { value: { ports: [443] }, locked: false } },
    packs: [{ name: 'corp-only', allow: [{ cidr: '10.0.0.0/8' }] }],
  });
  t.same(doc.agents['bot-1'].config, { exec_policy: { value: { enabled: true } } }, 'no lock at agent scope');
  t.same(doc.agents['bot-1'].packs, [{ name: 'lab', allow: [{ host: '*.lab' }] }], "the agent's policy_packs");
  t.same(
    doc.orgs['org-a'].packs,
    [{ name: 'no-paste', config: {}, deny: [{ host: 'pastebin.com' }] }],
    'an org pack of rules alone is carried too',
  );

  const loaded = validateSnapshot(doc);
  const enforced = snapshotGovernance(loaded, 'org-a', 'ops', 'bot-1');
  const read = (await call('GET', '/agents/bot-1/effective-governance')).body;
  const { agent, org_id, group_id, skipped, ...effective } = read;
  t.same([agent, org_id, group_id, skipped], ['bot-1', 'org-a', 'ops', []]);
  t.same(effective, JSON.parse(JSON.stringify(enforced)), 'the effective read is what the enclave resolves');
  t.same(enforced.packs, ['no-paste', 'corp-only', 'lab']);
  t.same(enforced.llm.providers, { allow_gates: [['anthropic']], deny: [] });
  t.equal(enforced.llm.inspection!.inspectors[0].rules[0].model_match, 'claude-*');
  t.equal(enforced.exec, true);

  const policy = (await call('GET', '/agents/bot-1/effective-policy')).body;
  t.equal(policy.credential_mode, 'passthrough', "the effective-policy read shows llm_policy's credential_mode");
  t.same(policy.upstream, { 'anthropic-messages': 'https://llm.internal' }, 'and its upstream, per wire format');

  t.equal((await call('DELETE', '/policies/llm?scope=org&org=org-a')).status, 204);
  t.notOk((await snapshot()).orgs['org-a'].config.llm_policy, 'a deleted policy leaves the snapshot');
});

t.test('model_match is checked as a glob; the upstream keys are wire formats or providers', async (t) => {
  const bad = async (body: unknown, detail: RegExp) =>
    t.match((await call('PUT', '/policies/llm', body)).body, { status: 400, detail }, String(detail));
  await bad(
    { inspection: { inspectors: [{ rules: [{ tool: 'x', verdict: 'deny', model_match: 'gpt-[' }] }] } },
    /^inspection\.inspectors\[0\]\.rules\[0\]\.model_match: is not a valid glob/,
  );
  await bad(
    { inspection: { inspectors: [{ rules: [{ tool: 'x', verdict: 'deny', model_match: ['gpt-*'] }] }] } },
    /model_match: must be a string/,
  );
  await bad({ upstream: { grpc: 'https://x' } }, /^upstream\.grpc: unknown field/);
  // An own `__proto__` key never reaches the validator (the JSON parser refuses it; the validator
  // refuses it too: test/pipeline/policy/snapshot-governance.test.ts).
  t.equal((await call('PUT', '/policies/llm', JSON.parse('{"upstream":{"__proto__":"https://x"}}'))).status, 400);
  await bad({ upstream: { openai: 'file:///etc/passwd' } }, /^upstream\.openai: must be an http\(s\) URL/);
});
