import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_SECRET, ORG_KEY, PLATFORM_KEY, baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';
import {
  validateSnapshot,
  snapshotAgent,
  snapshotOrg,
  orgFlag,
  policyLayers,
} from '../../../pipeline/policy/snapshot.ts';

// Ids that are Object.prototype's member names (docs/decisions.md, "Ids named like Object.prototype members are ids"):
// as a token's org_id or sub, as a secrets owner, and as org and agent ids in the snapshot, each is an id like any
// other. Before, `__proto__` as org_id read Object.prototype as the org and the call died with a 502 and no record.
const NAMES = ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf'];
const orgKey = (name: string) => `sk-org-key-of-${name}`;
const secrets: Record<string, Record<string, string>> = {
  'agent:agent-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY, db_password: AGENT_SECRET },
  'org:org-1': { 'llmproxy:llm.api_key': ORG_KEY },
};
for (const name of NAMES) secrets[`org:${name}`] = { 'llmproxy:llm.api_key': orgKey(name) };

const h = await startHarness({ secrets });
t.teardown(() => h.close());

const body = (model = 'claude-sonnet-4-5') =>
  JSON.stringify({ model, max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
async function call(claims: Record<string, unknown>, model?: string) {
  const before = h.audit.length;
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(claims) },
    body: body(model),
  });
  await until(() => h.proxy.proxy.inFlight === 0); // the call is over, its record appended
  return { status: r.status, text: r.text, records: h.audit.slice(before) };
}

/** A snapshot whose org and agent maps carry `name` as an own key (JSON has no prototype). */
function snapshotWith(name: string): unknown {
  const snapshot = baseSnapshot(h.upstream.url) as { orgs: Record<string, unknown>; agents: Record<string, unknown> };
  const orgs = Object.assign(Object.create(null) as Record<string, unknown>, snapshot.orgs);
  const agents = Object.assign(Object.create(null) as Record<string, unknown>, snapshot.agents);
  orgs[name] = {
    config: { model_policy: { value: { mode: 'allowlist', models: ['gpt-*'] } } },
    flags: {},
    groups: {},
    packs: [],
  };
  agents[name] = { org_id: name, name: 'proto', status: 'suspended', config: {} };
  return { ...snapshot, orgs, agents };
}

for (const name of NAMES) {
  t.test(`"${name}" as an id`, async (t) => {
    const foreign = await call({ sub: 'agent-1', org_id: name });
    t.equal(foreign.status, 403, 'as the org_id of a listed agent of another org: the org mismatch refusal');
    t.match(JSON.parse(foreign.text), { error: { type: 'permission_error' } });
    t.match(foreign.records, [
      {
        org_id: 'org-1',
        agent_id: 'agent-1',
        status: 403,
        decision: 'deny',
        error: `token org_id "${name}" differs from the agent's org in the snapshot`,
      },
    ]);

    const unlistedOrg = await call({ sub: 'agent-x', org_id: name });
    t.equal(
      unlistedOrg.status,
      200,
      'as the org_id of an unlisted agent: served under that org, as any org the snapshot does not list',
    );
    t.equal(
      h.upstream.received.at(-1)!.headers['x-api-key'],
      orgKey(name),
      "with that org's own key from the secrets file",
    );
    t.match(unlistedOrg.records, [{ org_id: name, agent_id: 'agent-x', status: 200, decision: 'allow' }]);

    const unlistedAgent = await call({ sub: name, org_id: 'org-1' });
    t.equal(unlistedAgent.status, 200, 'as the sub: an unlisted agent of its org');
    t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], ORG_KEY);
    t.match(unlistedAgent.records, [{ org_id: 'org-1', agent_id: name, status: 200 }]);

    // The snapshot lists an org and an agent of that id: their own entries apply.
    await h.writeSnapshot(snapshotWith(name));
    const listed = await call({ sub: name, org_id: name });
    t.equal(listed.status, 403, 'the listed agent of that id is suspended');
    t.match(listed.records, [
      { org_id: name, agent_id: name, status: 403, decision: 'deny', error: 'agent is suspended' },
    ]);
    const policed = await call({ sub: 'agent-y', org_id: name });
    t.equal(policed.status, 403, 'the listed org of that id has its model policy');
    t.match(JSON.parse(policed.text), { error: { type: 'content_policy_violation' } });
    t.match(policed.records, [
      { org_id: name, agent_id: 'agent-y', decision: 'block', findings: [{ inspector_type: 'model_restriction' }] },
    ]);
    t.equal((await call({ sub: 'agent-y', org_id: name }, 'gpt-4o')).status, 200, 'and allows what it allows');
    await h.writeSnapshot(baseSnapshot(h.upstream.url));
  });
}

t.test('the snapshot keeps such ids as entries and its lookups never reach a prototype', async (t) => {
  const doc = JSON.parse(
    `{"orgs": {"__proto__": {"flags": {"audit:llm": false}}, "org-1": {}}, "agents": {"__proto__": {"org_id": "__proto__"}}}`,
  );
  const s = validateSnapshot(doc);
  t.same(Object.keys(s.orgs).sort(), ['__proto__', 'org-1'], "__proto__ is an org, not the map's prototype");
  t.equal(snapshotOrg(s, '__proto__')?.flags['audit:llm'], false);
  t.equal(snapshotAgent(s, '__proto__')?.org_id, '__proto__');
  t.equal(orgFlag(s, '__proto__', 'audit:llm'), false);
  for (const name of NAMES.slice(1)) {
    t.equal(snapshotOrg(s, name), undefined, `no org ${name}`);
    t.equal(snapshotAgent(s, name), undefined, `no agent ${name}`);
    t.equal(orgFlag(s, name, 'inspect:llm'), true, 'an unlisted org: flags default on');
    t.same(policyLayers(s, name, name, name), { platform: {}, org: {}, group: {}, agent: {}, packs: [] });
  }
});

t.test("a translated tool_choice named like a prototype member is no choice, not Object.prototype's", async (t) => {
  const x = await startHarness({ proxy: { translate: true, translateUpstreamFormat: 'anthropic-messages' } });
  t.teardown(() => x.close());
  const token = await x.token();
  for (const path of ['/v1/chat/completions', '/v1/responses']) {
    for (const name of NAMES) {
      const payload =
        path === '/v1/chat/completions'
          ? { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tool_choice: name }
          : { model: 'gpt-4o', input: 'hi', tool_choice: name };
      const r = await x.call(path, {
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body: JSON.stringify(payload),
      });
      t.equal(r.status, 200, `${path} ${name}`);
      t.notOk('tool_choice' in x.upstream.received.at(-1)!.body!, `${path} ${name}: nothing forwarded as the choice`);
    }
  }
});
