import t from 'tap';
import { startStatusReport } from '../../../enclave/broker/status-report.ts';
import { brokerStore } from '../../fixtures/broker-store.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// The broker's status reports against a real control plane: delivered and removed once acknowledged;
// an `active` for an agent the control plane still shows `created` walks through `provisioning`; a
// refusal for good (404: not this enclave's agent) drops the row; a key the control plane does not take
// (401) keeps it, retried.

const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
const key = (await h.call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-1', owning_org: 'org-a' })).body
  .key.token as string;
await h.call('root', 'POST', '/enclaves', { name: 'us', enclave_id: 'enc-2', owning_org: 'org-a' });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1' });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'b', enclave_id: 'enc-2' });
const cpStatus = async (uid: string) => (await h.call('root', 'GET', `/orgs/org-a/agents/${uid}`)).body.status;

const store = await brokerStore({ enclaveId: 'enc-1' });
t.teardown(() => store.close());
const { deps } = store;
const queue = (uid: string, status: string, reason: string | null = null) =>
  deps.db.query('INSERT INTO broker_status_outbox (agent_uid, status, reason) VALUES ($1, $2, $3)', [
    uid,
    status,
    reason,
  ]);
const outbox = async () =>
  (await deps.db.query<{ agent_uid: string; attempts: number }>('SELECT agent_uid, attempts FROM broker_status_outbox'))
    .rows;
const controlplane = `https://127.0.0.1:${h.cp.port}`;

t.test('a key the control plane does not take: the report stays, retried with backoff', async (t) => {
  await queue('bot-1', 'active', 'bootstrapped');
  const r = startStatusReport(deps, { controlplane, brokerToken: 'dvxb_wrong', ca: h.ca, pollMs: 100, backoffMs: 50 });
  t.teardown(() => r.close());
  t.ok(await until(async () => (await outbox())[0]?.attempts >= 2, 10_000), 'tried again');
  t.ok(r.failures() >= 2);
  t.equal(await cpStatus('bot-1'), 'created');
  await r.close();
  t.same(
    (await outbox()).map((o) => o.agent_uid),
    ['bot-1'],
    'kept',
  );
});

t.test('delivered: active walks through provisioning; a refusal for good is dropped', async (t) => {
  await queue('bot-2', 'provisioning');
  await queue('nobody', 'provisioning');
  const r = startStatusReport(deps, { controlplane, brokerToken: key, ca: h.ca, pollMs: 100 });
  t.teardown(() => r.close());
  t.ok(await until(async () => (await outbox()).length === 0, 10_000), 'the outbox empties');
  t.equal(await cpStatus('bot-1'), 'active', 'created → provisioning → active');
  t.equal(await cpStatus('bot-2'), 'created', "another enclave's agent is not touched");
  t.ok(store.logs.some((l) => l.includes('refused the status report for good') && l.includes('bot-2')));
  t.ok(store.logs.some((l) => l.includes('refused the status report for good') && l.includes('nobody')));
  t.equal(r.failures(), 0);
  t.match(
    h.audit.filter((a) => a.resource === 'agent:bot-1' && a.actor === 'enclave:enc-1').map((a) => a.action),
    ['agent.status.active', 'agent.status.provisioning', 'agent.status.active'],
    'the refused step, then the path, audited at the control plane',
  );

  // Woken by the bus, not only by the poll.
  await queue('bot-1', 'suspended', 'refresh_token_replayed');
  deps.bus.emit('agent', 'bot-1');
  t.ok(await until(async () => (await cpStatus('bot-1')) === 'suspended', 10_000));
});
