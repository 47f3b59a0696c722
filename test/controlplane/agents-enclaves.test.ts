import t from 'tap';
import { Agent, request } from 'undici';
import { SseParser, type SseEvent } from '../../core/sse.ts';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Agents (group-narrowed upsert, containment, restore), the enclave registry and its broker key, and
// the enclave-facing surface: the snapshot and the SSE event stream (resume, heartbeat, purge).
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
    { clientId: 'ops-lead', org: 'org-a', human: true },
    { clientId: 'admin-b', org: 'org-b', human: true },
    { clientId: 'gateway', org: 'org-a' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const cp = await h.start({ seedAdmin: ['root'], agentTokenIssuerUrl: 'https://cp.dvx.test', brokerHeartbeatMs: 300 });
t.teardown(() => cp.close());
const call = (who: string, method: string, path: string, body?: unknown) => h.callAt(cp.port, who, method, path, body);
const dispatcher = new Agent({ connect: { rejectUnauthorized: false } });
t.teardown(() => dispatcher.close());

for (const [id, name] of [
  ['org-a', 'A'],
  ['org-b', 'B'],
])
  await call('root', 'POST', '/orgs', { id, name });
for (const g of ['ops', 'dev']) await call('root', 'POST', '/orgs/org-a/groups', { id: g, name: g });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
await call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });
await call('root', 'POST', '/orgs/org-a/grants', {
  principal: 'user:ops-lead',
  capability: 'agents:manage',
  group: 'ops',
});
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:gateway', capability: 'agents:manage' });

let brokerToken = '';
t.test('register an enclave: the broker key is shown once; names are unique; listing by enclaves:read', async (t) => {
  const reg = await call('root', 'POST', '/enclaves', { name: 'eu-prod', enclave_id: 'enc-1', owning_org: 'org-a' });
  t.equal(reg.status, 201);
  t.match(reg.body, {
    enclave_id: 'enc-1',
    subject: 'enclave:enc-1',
    key: { type: 'broker_key', enclave_id: 'enc-1', token: /^dvxb_/ },
  });
  brokerToken = reg.body.key.token;
  t.equal(
    (await call('root', 'POST', '/enclaves', { name: 'eu-prod', owning_org: 'org-a' })).status,
    409,
    'the friendly name is unique',
  );
  t.equal(
    (await call('root', 'POST', '/enclaves', { name: 'b-1', enclave_id: 'enc-b', owning_org: 'org-b' })).status,
    201,
  );
  t.match((await call('root', 'POST', '/enclaves', { name: 'x', owning_org: 'org-zz' })).body, {
    status: 400,
    detail: /^owning_org: no org/,
  });
  t.equal(
    (await call('admin-a', 'POST', '/enclaves', { name: 'mine', owning_org: 'org-a' })).status,
    403,
    'registry changes are platform administration',
  );
  const mine = (await call('admin-a', 'GET', '/enclaves')).body;
  t.same(
    mine.map((e: { enclave_id: string }) => e.enclave_id),
    ['enc-1'],
    "an org admin sees its org's enclaves",
  );
  t.notOk(JSON.stringify(mine).includes(brokerToken), 'never the key again');
  t.same((await call('root', 'GET', '/enclaves')).body.map((e: { enclave_id: string }) => e.enclave_id).sort(), [
    'enc-1',
    'enc-b',
  ]);
  const addr = await call('root', 'PUT', '/enclaves/enc-1/address', { broker_url: 'https://broker.eu.example:8450' });
  t.match(addr.body, {
    enclave_id: 'enc-1',
    broker_url: 'https://broker.eu.example:8450',
    address_source: 'operator',
    address_updated_at: /T/,
  });
  t.same((await call('root', 'PUT', '/enclaves/enc-1/isolation-class', { isolationClass: 'vm' })).body, {
    isolationClass: 'vm',
  });
  t.match((await call('root', 'PUT', '/enclaves/enc-1/isolation-class', { isolationClass: 'vault' })).body, {
    status: 400,
    detail: /^isolationClass: must be one of plain, vm, node-cvm, per-agent-tee/,
  });
});

t.test('agents: the body group only narrows; upsert checks the stored group', async (t) => {
  const created = await call('ops-lead', 'POST', '/orgs/org-a/agents', {
    uid: 'bot-1',
    name: 'builder',
    group: 'ops',
    enclave_id: 'enc-1',
    image: 'img:1',
    command: ['run'],
  });
  t.equal(created.status, 201);
  t.match(created.body, {
    uid: 'bot-1',
    name: 'builder',
    group_id: 'ops',
    org_id: 'org-a',
    enclave_id: 'enc-1',
    contained: false,
    status: 'created',
    command: ['run'],
  });
  t.equal(
    (await call('ops-lead', 'POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'x', group: 'dev' })).status,
    403,
    'not her group',
  );
  t.equal(
    (await call('ops-lead', 'POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'x' })).status,
    403,
    'nor org-wide',
  );
  t.equal(
    (await call('admin-a', 'POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'x', group: 'dev' })).status,
    201,
    'org-wide covers every group',
  );
  t.equal(
    (await call('ops-lead', 'POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'moved', group: 'ops' })).status,
    403,
    'an upsert over a group she does not manage',
  );
  const updated = await call('ops-lead', 'POST', '/orgs/org-a/agents', {
    uid: 'bot-1',
    name: 'builder-2',
    group: 'ops',
    enclave_id: 'enc-1',
  });
  t.equal(updated.status, 200, 'an upsert answers 200');
  t.equal(updated.body.name, 'builder-2');
  t.equal(
    (await call('admin-b', 'POST', '/orgs/org-b/agents', { uid: 'bot-1', name: 'steal' })).status,
    409,
    'the uid belongs to another org',
  );
  t.match(
    (await call('admin-a', 'POST', '/orgs/org-a/agents', { uid: 'bot-3', name: 'x', enclave_id: 'enc-b' })).body,
    { status: 400, detail: /^enclave_id: enclave enc-b belongs to another org/ },
  );
  t.same(
    (await call('ops-lead', 'GET', '/orgs/org-a/agents')).body.map((a: { uid: string }) => a.uid),
    ['bot-1'],
    "she lists her group's agents",
  );
  t.same(
    (await call('admin-a', 'GET', '/orgs/org-a/agents')).body.map((a: { uid: string }) => a.uid),
    ['bot-1', 'bot-2'],
  );
  t.equal((await call('admin-b', 'GET', '/orgs/org-a/agents/bot-1')).status, 403);
  t.match((await call('admin-a', 'POST', '/orgs/org-a/agents', { uid: 'bad uid', name: 'x' })).body, {
    status: 400,
    detail: /^uid:/,
  });
});

t.test('containment, suspension and restore; a contained agent gets no agent-operator token', async (t) => {
  t.equal((await call('gateway', 'POST', '/orgs/org-a/agents/bot-1/operator-token')).status, 200);
  const contained = await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', {});
  t.same(contained.body, {
    agent: 'bot-1',
    contained: true,
    nudged: true,
    published: true,
    enclave_id: 'enc-1',
    org_id: 'org-a',
  });
  const mint = await call('gateway', 'POST', '/orgs/org-a/agents/bot-1/operator-token');
  t.equal(mint.status, 403);
  t.match(mint.body.detail, /contained/);
  t.equal(
    (await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: false })).body.contained,
    false,
  );
  t.equal(
    (await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).status,
    409,
    'only a suspended or isolated agent is restored',
  );
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/suspend')).body.status, 'suspended');
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).body.status, 'active');
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/isolate')).body.status, 'isolated');
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).body.status, 'active');
});

/** Opens the broker event stream; collects events until `until` says stop or the time runs out. */
async function stream(
  token: string,
  lastEventId: string | null,
  until: (events: SseEvent[], comments: number) => boolean,
  ms = 5000,
): Promise<{ status: number; events: SseEvent[]; heartbeats: number }> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), ms);
  const res = await request(`https://127.0.0.1:${cp.port}/v1/broker/events`, {
    dispatcher,
    signal: controller.signal,
    headers: { authorization: `Bearer ${token}`, ...(lastEventId ? { 'last-event-id': lastEventId } : {}) },
  });
  const events: SseEvent[] = [];
  let heartbeats = 0;
  if (res.statusCode !== 200) {
    clearTimeout(timer);
    await res.body.dump();
    return { status: res.statusCode, events, heartbeats };
  }
  const parser = new SseParser();
  try {
    for await (const chunk of res.body) {
      heartbeats += (String(chunk).match(/^: heartbeat$/gm) ?? []).length;
      events.push(...parser.push(chunk as Buffer));
      if (until(events, heartbeats)) break;
    }
  } catch {
    // aborted at the deadline
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
  return { status: 200, events, heartbeats };
}

t.test('broker events: agent.created and nudges, resume with Last-Event-ID, heartbeats', async (t) => {
  t.equal((await stream('dvxb_wrong', null, () => true)).status, 401);
  const first = await stream(brokerToken, null, (ev) => ev.some((e) => e.event === 'agent.changed'));
  t.same(
    first.events.map((e) => e.event).slice(0, 2),
    ['enclave.changed', 'agent.created'],
    'in the order they happened',
  );
  const created = first.events[1];
  t.same(JSON.parse(created.data), {
    kind: 'agent.created',
    agent_id: 'bot-1',
    agent_name: 'builder',
    org_id: 'org-a',
  });
  t.match(created.id, /^\d+$/);
  t.ok(
    first.events.every((e, i) => i === 0 || Number(e.id) > Number(first.events[i - 1].id)),
    'ids increase',
  );
  const seen = first.events.at(-1)!.id!;
  // A change while no one listens is delivered on resume, after the cursor only.
  await call('admin-a', 'PUT', '/config/llmproxy/model_policy', {
    value: JSON.stringify({ mode: 'blocklist', models: ['gpt-*'] }),
  });
  const resumed = await stream(brokerToken, seen, (ev) => ev.some((e) => e.event === 'policy.changed'));
  t.ok(
    resumed.events.every((e) => Number(e.id) > Number(seen)),
    'nothing at or before the cursor again',
  );
  t.match(JSON.parse(resumed.events.find((e) => e.event === 'policy.changed')!.data), {
    service: 'llmproxy',
    key: 'model_policy',
    scope: 'org:org-a',
  });
  // Live: a write while connected arrives on the open stream.
  const live = stream(brokerToken, resumed.events.at(-1)!.id!, (ev) => ev.some((e) => e.event === 'flags.changed'));
  await new Promise((r) => setTimeout(r, 200));
  await call('admin-a', 'PUT', '/feature-flags/inspect:llm', { enabled: false });
  t.ok(
    (await live).events.some((e) => e.event === 'flags.changed'),
    'delivered live',
  );
  const beats = await stream(brokerToken, '999999', (_ev, n) => n >= 2, 3000);
  t.ok(beats.heartbeats >= 2, 'heartbeat comments keep the stream alive');
  t.equal((await stream(brokerToken, 'abc', () => true)).status, 400, 'a malformed Last-Event-ID');
  t.equal((await stream(brokerToken, 'abc', () => true)).status, 400);
});

t.test('the snapshot is the contract the proxy validates, scoped to the enclave', async (t) => {
  const res = await request(`https://127.0.0.1:${cp.port}/v1/broker/snapshot`, {
    dispatcher,
    headers: { authorization: `Bearer ${brokerToken}` },
  });
  t.equal(res.statusCode, 200);
  const snap = validateSnapshot(await res.body.json());
  t.match(snap.enclave, { id: 'enc-1', name: 'eu-prod', isolation_class: 'vm' });
  t.same(Object.keys(snap.agents), ['bot-1'], 'only the agents this enclave runs');
  t.same(Object.keys(snap.orgs), ['org-a']);
  t.equal(snap.orgs['org-a'].flags['inspect:llm'], false);
  t.match(snap.orgs['org-a'].config.model_policy, { value: { mode: 'blocklist', models: ['gpt-*'] } });
  t.match(snap.agents['bot-1'], { org_id: 'org-a', group_id: 'ops', status: 'active', contained: false });
  const anon = await request(`https://127.0.0.1:${cp.port}/v1/broker/snapshot`, { dispatcher });
  t.equal(anon.statusCode, 401);
  t.match(await anon.body.json(), { type: 'https://dvx.dev/problems/unauthenticated' });
  const rotated = await call('root', 'POST', '/enclaves/enc-1/broker-key');
  const old = await request(`https://127.0.0.1:${cp.port}/v1/broker/snapshot`, {
    dispatcher,
    headers: { authorization: `Bearer ${brokerToken}` },
  });
  t.equal(old.statusCode, 401, 'a rotated key stops working');
  await old.body.dump();
  brokerToken = rotated.body.key.token;
});

t.test('the broker mints agent-operator tokens for its own, uncontained agents', async (t) => {
  const mint = async (uid: string, token = brokerToken) => {
    const r = await request(`https://127.0.0.1:${cp.port}/v1/broker/agents/${uid}/operator-token`, {
      method: 'POST',
      dispatcher,
      headers: { authorization: `Bearer ${token}` },
    });
    return { status: r.statusCode, body: (await r.body.json()) as Record<string, unknown> };
  };
  const ok = await mint('bot-1');
  t.equal(ok.status, 200);
  t.match(ok.body, { token_type: 'Bearer', expires_in: 60, access_token: /^ey/ });
  const who = await h.rawAt(cp.port, 'GET', '/api/v1/whoami', undefined, {
    authorization: `Bearer ${ok.body.access_token}`,
  });
  t.match(JSON.parse(who.text), { subject: 'agent:bot-1', kind: 'agent-operator', org_id: 'org-a' });
  t.equal((await mint('bot-2')).status, 404, 'bot-2 runs on no enclave');
  t.equal((await mint('bot-1', 'dvxb_nope')).status, 401);
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: true });
  t.equal((await mint('bot-1')).status, 403, 'contained');
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: false });
});

t.test('a deleted enclave is gone from the registry', async (t) => {
  t.equal((await call('root', 'DELETE', '/enclaves/enc-b')).status, 204);
  t.equal((await call('root', 'GET', '/enclaves/enc-b')).status, 404);
  t.equal((await call('root', 'DELETE', '/enclaves/enc-b')).status, 404);
});
