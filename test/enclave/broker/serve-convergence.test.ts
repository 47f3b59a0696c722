import t from 'tap';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// `dvx serve broker` following a real control plane, through its agent routes: the operator creates an
// agent → its bootstrap token appears in its host → the exchange → `active` at the control plane; a
// replayed refresh token → 409 and `suspended` at the control plane; the operator's restore → a new
// token, and the agent back; the operator's suspend → 403 within seconds.

const cph = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => cph.close());
const call = (who: string, method: string, path: string, body?: unknown) => cph.call(who, method, path, body);
await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
const key = (await call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-1', owning_org: 'org-a' })).body.key
  .token as string;
await writeFile(join(cph.dir, 'cp-ca.pem'), cph.ca);

const h = await startBrokerHarness({
  controlplane: `https://127.0.0.1:${cph.cp.port}`,
  brokerKey: key,
  caCert: join(cph.dir, 'cp-ca.pem'),
  enclaveId: 'enc-1',
  enclaveName: 'eu',
});
t.teardown(() => h.close());
await h.broker.convergence.ready;

const WITHIN = 10_000;
const tokenFile = join(h.dir, 'state', 'agents', 'bot-1', 'bootstrap-token');
const cpStatus = async () => (await call('admin-a', 'GET', '/orgs/org-a/agents/bot-1')).body.status;
const fileOnce = async (not?: string) => {
  let token = '';
  await until(async () => {
    token = await readFile(tokenFile, 'utf8');
    return token !== not;
  }, WITHIN);
  return token;
};

t.test('create → token in the host → bootstrap → active at the control plane', async (t) => {
  await call('admin-a', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'builder', enclave_id: 'enc-1' });
  const token = await fileOnce();
  t.match(token, /^dvxb_/);
  t.ok(await until(async () => (await cpStatus()) === 'provisioning', WITHIN), 'provisioning');
  const boot = await h.agent('POST', '/v1/agent/bootstrap', { token });
  t.equal(boot.status, 200);
  t.match(boot.body, { agent_id: 'bot-1', org_id: 'org-a', agent_name: 'builder', jwt: /^ey/ });
  t.ok(await until(async () => (await cpStatus()) === 'active', WITHIN), 'active at the control plane');
  t.equal((await h.agent('POST', '/v1/agent/bootstrap', { token })).status, 401, 'single use');

  // Renewal, then a replay of the used token.
  const renewed = await h.agent('POST', '/v1/agent/refresh', { refresh_token: boot.body.refresh_token });
  t.equal(renewed.status, 200);
  const replay = await h.agent('POST', '/v1/agent/refresh', { refresh_token: boot.body.refresh_token });
  t.equal(replay.status, 409);
  t.ok(await until(async () => (await cpStatus()) === 'suspended', WITHIN), 'suspended at the control plane');
  t.equal((await h.agent('GET', '/v1/agent/config', undefined, renewed.body.jwt)).status, 403);

  // The operator restores: a new bootstrap token, the agent back.
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore');
  const fresh = await fileOnce(token);
  t.not(fresh, token, 're-provisioned with a new token');
  t.ok(await until(async () => (await cpStatus()) === 'provisioning', WITHIN));
  const again = await h.agent('POST', '/v1/agent/bootstrap', { token: fresh });
  t.equal(again.status, 200, 'the agent is back');
  t.ok(await until(async () => (await cpStatus()) === 'active', WITHIN));

  // The operator suspends: every agent route refuses within seconds.
  await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/suspend');
  t.ok(
    await until(
      async () => (await h.agent('GET', '/v1/agent/config', undefined, again.body.jwt)).status === 403,
      WITHIN,
    ),
    '403 once the broker converged',
  );
  t.notOk(
    h.logs.some((l) => l.includes(token) || l.includes(fresh)),
    'no bootstrap token in any log line',
  );
});
