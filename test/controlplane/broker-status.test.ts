import t from 'tap';
import { Agent, request } from 'undici';
import { SseParser, type SseEvent } from '../../core/sse.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// PUT /v1/broker/agents/{uid}/status: the broker reports the statuses it owns (provisioning, active) and
// the suspension of a replayed refresh token; the operator's suspended and isolated stand (409). Only
// for an agent of the calling enclave (else 404), authenticated by the broker key (else 401).
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const cp = h.cp;
const call = (who: string, method: string, path: string, body?: unknown) => h.call(who, method, path, body);
const dispatcher = new Agent({ connect: { rejectUnauthorized: false } });
t.teardown(() => dispatcher.close());

await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
const key1 = (await call('root', 'POST', '/enclaves', { name: 'one', enclave_id: 'enc-1', owning_org: 'org-a' })).body
  .key.token as string;
const key2 = (await call('root', 'POST', '/enclaves', { name: 'two', enclave_id: 'enc-2', owning_org: 'org-a' })).body
  .key.token as string;
for (const [uid, enclave] of [
  ['bot-1', 'enc-1'],
  ['bot-2', 'enc-2'],
  ['bot-3', 'enc-1'],
  ['bot-4', ''],
])
  await call('admin-a', 'POST', '/orgs/org-a/agents', { uid, name: uid, ...(enclave ? { enclave_id: enclave } : {}) });

async function put(uid: string, body: unknown, key: string | null = key1, raw = false) {
  const res = await h.rawAt(
    cp.port,
    'PUT',
    `/v1/broker/agents/${uid}/status`,
    raw ? (body as string) : JSON.stringify(body),
    {
      'content-type': 'application/json',
      ...(key === null ? {} : { authorization: `Bearer ${key}` }),
    },
  );
  return { status: res.status, body: res.text ? JSON.parse(res.text) : null, type: res.headers['content-type'] };
}
const operatorView = async (uid: string) => (await call('admin-a', 'GET', `/orgs/org-a/agents/${uid}`)).body;
const audited = (action: string) => h.audit.filter((r) => r.action === action && r.resource === 'agent:bot-1');

t.test('the broker moves an agent through the statuses it owns', async (t) => {
  t.equal((await operatorView('bot-1')).status, 'created');
  const prov = await put('bot-1', { status: 'provisioning', reason: 'provisioned' });
  t.equal(prov.status, 200);
  t.match(prov.body, { uid: 'bot-1', status: 'provisioning', enclave_id: 'enc-1', org_id: 'org-a' });
  t.equal((await operatorView('bot-1')).status, 'provisioning', 'agentView shows it');
  t.match(audited('agent.status.provisioning'), [
    { actor: 'enclave:enc-1', actor_kind: 'service', outcome: 'allow', reason: 'provisioned', org_id: 'org-a' },
  ]);

  t.equal((await put('bot-1', { status: 'active' })).body.status, 'active');
  const again = await put('bot-1', { status: 'active', reason: null });
  t.equal(again.status, 200, 'the same status again is a no-op');
  t.equal(audited('agent.status.active').length, 1, 'and writes nothing');
  t.equal((await put('bot-1', { status: 'provisioning' })).body.status, 'provisioning', 'active → provisioning');
  t.equal((await put('bot-1', { status: 'active' })).body.status, 'active');

  // A new agent goes through provisioning before it is active.
  const skip = await put('bot-3', { status: 'active' });
  t.equal(skip.status, 409);
  t.match(skip.body, { type: 'https://dvx.dev/problems/conflict', status: 409, detail: /bot-3 is created/ });
  t.equal((await operatorView('bot-3')).status, 'created');
  t.equal((await put('bot-3', { status: 'suspended', reason: 'refresh_token_replayed' })).body.status, 'suspended');
});

t.test('a replayed refresh token suspends; only the operator restores', async (t) => {
  const s = await put('bot-1', { status: 'suspended', reason: 'refresh_token_replayed' });
  t.equal(s.status, 200);
  t.equal(s.body.status, 'suspended');
  t.equal((await operatorView('bot-1')).status, 'suspended');
  for (const status of ['active', 'provisioning']) {
    const refused = await put('bot-1', { status });
    t.equal(refused.status, 409, `suspended → ${status} refused`);
    t.match(refused.body, { detail: /bot-1 is suspended/ });
    t.match(refused.type, /^application\/problem\+json/);
  }
  t.equal((await put('bot-1', { status: 'suspended' })).status, 200, 'suspended again: nothing changes');
  t.ok(
    h.audit.some(
      (r) => r.action === 'agent.status.active' && r.outcome === 'deny' && r.reason === 'agent is suspended',
    ),
    'a refusal is audited',
  );
  t.equal((await operatorView('bot-1')).status, 'suspended');

  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/isolate');
  const iso = await put('bot-1', { status: 'suspended' });
  t.equal(iso.status, 409, 'isolated → suspended refused');
  t.match(iso.body, { detail: /bot-1 is isolated/ });
  t.equal((await put('bot-1', { status: 'provisioning' })).status, 409);

  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).body.status, 'active');
  t.equal((await put('bot-1', { status: 'provisioning', reason: 'restored' })).body.status, 'provisioning');
});

t.test('the change reaches the enclave: agent.changed and the snapshot', async (t) => {
  await put('bot-1', { status: 'active' });
  const events = await readEvents(key1, (ev) =>
    ev.some((e) => e.event === 'agent.changed' && JSON.parse(e.data).status === 'active'),
  );
  t.ok(
    events.some((e) => e.event === 'agent.changed' && JSON.parse(e.data).agent_id === 'bot-1'),
    'published to the enclave',
  );
  const snap = await h.rawAt(cp.port, 'GET', '/v1/broker/snapshot', undefined, { authorization: `Bearer ${key1}` });
  t.match(JSON.parse(snap.text).agents['bot-1'], { status: 'active' });
});

t.test('only the enclave that runs the agent, with its key', async (t) => {
  const anon = await put('bot-1', { status: 'active' }, null);
  t.equal(anon.status, 401);
  t.match(anon.body, { type: 'https://dvx.dev/problems/unauthenticated' });
  t.equal((await put('bot-1', { status: 'active' }, 'dvxb_nope')).status, 401);
  t.equal((await put('bot-1', { status: 'bogus' }, null)).status, 401, 'authenticated before the body is validated');
  const other = await put('bot-2', { status: 'provisioning' });
  t.equal(other.status, 404, "another enclave's agent");
  t.match(other.body, { type: 'https://dvx.dev/problems/not-found' });
  t.equal((await operatorView('bot-2')).status, 'created', 'unchanged');
  t.equal((await put('bot-2', { status: 'provisioning' }, key2)).status, 200, 'its own enclave may');
  t.equal((await put('bot-4', { status: 'provisioning' })).status, 404, 'an agent on no enclave');
  t.equal((await put('nobody', { status: 'provisioning' })).status, 404);
});

t.test('a malformed body is a 400 Problem', async (t) => {
  for (const [body, detail] of [
    [{}, /^status: is required/],
    [{ status: 'isolated' }, /^status: must be one of provisioning, active, suspended/],
    [{ status: 'created' }, /^status: must be one of/],
    [{ status: 7 }, /^status:/],
    [{ status: 'active', extra: 1 }, /^extra: unknown field/],
    [{ status: 'active', reason: 'no spaces allowed' }, /^reason:/],
    [{ status: 'active', reason: 'x'.repeat(101) }, /^reason:/],
    [['active'], /./],
  ] as const) {
    const r = await put('bot-1', body);
    t.equal(r.status, 400, JSON.stringify(body).slice(0, 40));
    t.match(r.body, { type: 'https://dvx.dev/problems/bad-request', detail });
  }
  for (const raw of ['{"status":', 'null', '"active"']) t.equal((await put('bot-1', raw, key1, true)).status, 400, raw);
  t.equal((await put('bot-1', { status: 'active\u0000' })).status, 400, 'a NUL byte');
  t.equal((await operatorView('bot-1')).status, 'active', 'nothing changed');
});

/** Reads the enclave's event stream from the start until `until` holds (or 5 s pass). */
async function readEvents(key: string, until: (events: SseEvent[]) => boolean): Promise<SseEvent[]> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 5000);
  const res = await request(`https://127.0.0.1:${cp.port}/v1/broker/events`, {
    dispatcher,
    signal: controller.signal,
    headers: { authorization: `Bearer ${key}` },
  });
  const events: SseEvent[] = [];
  const parser = new SseParser();
  try {
    for await (const chunk of res.body) {
      events.push(...parser.push(chunk as Buffer));
      if (until(events)) break;
    }
  } catch {
    // aborted at the deadline
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
  return events;
}
