import t from 'tap';
import { storeAgentView } from '../../../enclave/broker/agent-view.ts';
import type { BrokerAgent } from '../../../enclave/broker/agents.ts';
import { putSecret } from '../../../enclave/broker/secrets.ts';
import { AgentConfigLockedError } from '../../../enclave/errors.ts';
import { validateConfigDocument } from '../../../pipeline/policy/config-values.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';

// An agent's config as the broker serves it: the control plane's values merged platform → org → group →
// agent with locks, the agent's own writes at agent scope, a key declared secret filled from the secret
// store by name, and a hash that moves exactly when the config does.

const h = await startBrokerHarness();
t.teardown(() => h.close());
const deps = h.broker.deps;
const agent: BrokerAgent = {
  uid: 'a-1',
  org_id: 'org-1',
  group_id: 'ops',
  name: 'builder',
  status: 'active',
  cp_status: 'active',
  contained: false,
  reason: null,
};
const row = (value: unknown, extra: { locked?: boolean; secret?: boolean } = {}) => ({
  value,
  locked: extra.locked ?? false,
  secret: extra.secret ?? false,
});
let doc = validateConfigDocument({
  version: 'v1',
  enclave: { id: 'enc-test', name: 'test-enclave' },
  platform: { 'log.level': row('info'), region: row('eu', { locked: true }), model: row('claude-haiku') },
  orgs: {
    'org-1': {
      config: { model: row('claude-sonnet'), 'api.token': row(null, { secret: true }), 'log.level': row('warn') },
      groups: { ops: { config: { model: row('claude-opus'), 'deploy.target': row('prod', { locked: true }) } } },
    },
    'org-2': { config: { leak: row('other org') }, groups: {} },
  },
  agents: { 'a-1': { org_id: 'org-1', group_id: 'ops', config: { 'log.level': row('debug') } } },
});
const view = storeAgentView(deps, () => doc);
const actor = { subject: 'admin', kind: 'human-operator' };

t.test('merged with locks; the agent row wins where nothing is locked; other orgs never show', async (t) => {
  const { config, config_hash } = await view.config(agent);
  t.same(config, {
    'deploy.target': 'prod',
    'log.level': 'debug',
    model: 'claude-opus',
    region: 'eu',
  });
  t.match(config_hash, /^[0-9a-f]{64}$/);
  t.notOk('api.token' in config, 'a declared secret without its bytes is left out, never null');
});

t.test('a declared-secret key gets its bytes from the secret store, narrowest scope first', async (t) => {
  const before = (await view.config(agent)).config_hash;
  await putSecret(deps, actor, { kind: 'org', org: 'org-1' }, 'api.token', 'org-level-token-1');
  t.equal((await view.config(agent)).config['api.token'], 'org-level-token-1');
  await putSecret(deps, actor, { kind: 'agent', org: 'org-1', uid: 'a-1' }, 'api.token', 'agent-level-token');
  const after = await view.config(agent);
  t.equal(after.config['api.token'], 'agent-level-token');
  t.not(after.config_hash, before, 'the hash follows the value');
  // The same config built again hashes the same.
  t.equal((await view.config(agent)).config_hash, after.config_hash);
});

t.test("the agent's own writes: over its agent rows, never over a lock or a declared secret", async (t) => {
  await deps.db.transaction((tx) => view.putConfig(tx, agent, 'log.level', 'error'));
  t.equal((await view.config(agent)).config['log.level'], 'error');
  await deps.db.transaction((tx) => view.putConfig(tx, agent, 'feature.x', { on: true }));
  t.same((await view.config(agent)).config['feature.x'], { on: true });
  for (const key of ['region', 'deploy.target', 'api.token'])
    await t.rejects(
      deps.db.transaction((tx) => view.putConfig(tx, agent, key, 'mine')),
      AgentConfigLockedError,
      `${key} refused`,
    );
  await t.rejects(
    deps.db.transaction((tx) => view.putConfig(tx, agent, '../x', 1)),
    /key:/,
  );
  t.equal((await view.config(agent)).config.region, 'eu', 'a refused write changed nothing');
});

t.test('before any config document: only what the agent wrote', async (t) => {
  const saved = doc;
  doc = null as never;
  t.teardown(() => {
    doc = saved;
  });
  const { config } = await storeAgentView(deps, () => null).config(agent);
  t.same(config, { 'feature.x': { on: true }, 'log.level': 'error' });
});

t.test('a declared-secret key never fills a satellite secret (a name with ":") into the config', async (t) => {
  // An operator who may author config but not the enclave's secrets declares the LLM key's name secret:
  // the agent must still never read the org's LLM credential, which only satellites are served.
  await putSecret(deps, actor, { kind: 'org', org: 'org-1' }, 'llmproxy:llm.api_key', 'sk-org-llm-key-0123');
  await putSecret(deps, actor, { kind: 'agent', org: 'org-1', uid: 'a-1' }, 'agent:llmproxy.llm.api_key', 'sk-a1');
  const saved = doc;
  doc = validateConfigDocument({
    version: 'v2',
    enclave: { id: 'enc-test', name: 'test-enclave' },
    platform: {},
    orgs: {
      'org-1': {
        config: { 'llmproxy:llm.api_key': row(null, { secret: true }) },
        groups: {},
      },
    },
    agents: {
      'a-1': {
        org_id: 'org-1',
        group_id: 'ops',
        config: { 'agent:llmproxy.llm.api_key': row(null, { secret: true }) },
      },
    },
  });
  t.teardown(() => {
    doc = saved;
  });
  const { config } = await view.config(agent);
  t.notOk('llmproxy:llm.api_key' in config, 'the org LLM key stays a satellite secret');
  t.notOk('agent:llmproxy.llm.api_key' in config, "the agent's LLM key stays a satellite secret");
  t.notMatch(JSON.stringify(config), /sk-org-llm-key|sk-a1/);
});
