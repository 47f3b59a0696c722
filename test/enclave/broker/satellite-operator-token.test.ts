import t from 'tap';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getAgent } from '../../../enclave/broker/agents.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { startTcpProxy } from '../../fixtures/tcp-proxy.ts';
import { addAgent } from './secrets-fixture.ts';

// `POST /v1/satellite/agents/{uid}/operator-token`: the broker refuses an agent it does not run (404) or
// one it refuses itself (403, audited) before the control plane is asked; otherwise it asks a real
// control plane with its broker key and relays the answer (502 when there is none to relay, 503 without
// --controlplane).

t.test("the agent-operator token on an agent's behalf, through a real control plane", async (t) => {
  const cph = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
    seedAdmin: ['root'],
    agentTokenIssuerUrl: 'https://cp.dvx.test',
  });
  t.teardown(() => cph.close());
  await cph.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  const reg = await cph.call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-test', owning_org: 'org-a' });
  t.equal(reg.status, 201);
  const brokerKey = reg.body.key.token as string;
  const dir = await mkdtemp(join(tmpdir(), 'dvx-cp-ca-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'ca.pem'), cph.ca);

  // First without --controlplane: the broker's own refusals, and a 503 for the rest.
  const h = await startBrokerHarness();
  t.teardown(() => h.close());
  const token = (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim();
  const mint = (uid: string) => h.agent('POST', `/v1/satellite/agents/${uid}/operator-token`, undefined, token);
  await addAgent(h, 'agent-1', 'org-a', 'g-1');
  await addAgent(h, 'agent-contained', 'org-a', 'g-1', 'active', true);
  await addAgent(h, 'agent-suspended', 'org-a', 'g-1', 'suspended');
  t.equal((await mint('nobody')).status, 404, 'an agent this enclave does not run');
  const contained = await mint('agent-contained');
  t.equal(contained.status, 403);
  t.match(contained.body.detail, /contained/);
  t.equal((await mint('agent-suspended')).status, 403, 'a suspended agent likewise');
  t.match(
    h.audit.find((r) => r.action === 'agent-operator-token.mint'),
    {
      outcome: 'deny',
      resource: 'agent:agent-contained',
      org_id: 'org-a',
      actor: 'satellite',
      reason: 'agent agent-contained is contained',
    },
    'the refusal is audited',
  );
  const none = await mint('agent-1');
  t.equal(none.status, 503, 'no --controlplane');
  t.match(none.body, { type: 'https://dvx.dev/problems/no-controlplane', detail: /--controlplane/ });

  // With the control plane: an agent it created on this enclave reaches the broker, and its token comes
  // back through it.
  await h.broker.close();
  // Through a relay the test can cut: the control plane unreachable without stopping it.
  const relay = await startTcpProxy(cph.cp.port);
  t.teardown(() => relay.close());
  const withCp = {
    controlplane: `https://127.0.0.1:${relay.port}`,
    brokerKey,
    enclaveId: 'enc-test',
    caCert: join(dir, 'ca.pem'),
  };
  await h.restart(withCp);
  t.equal(
    (await cph.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'one', enclave_id: 'enc-test' }))
      .status,
    201,
  );
  t.ok(await until(async () => (await getAgent(h.broker.deps.db, 'bot-1')) !== null), 'the broker runs bot-1');
  const ok = await mint('bot-1');
  t.equal(ok.status, 200);
  t.match(ok.body, { token_type: 'Bearer', expires_in: 60, access_token: /^ey/ });
  t.equal(ok.headers['cache-control'], 'no-store');
  t.match(cph.audit.at(-1), {
    action: 'agent-operator-token.mint',
    actor: 'enclave:enc-test',
    resource: 'agent:bot-1',
  });

  // Contained by an operator on the control plane: once the broker has it, the broker refuses, and the
  // control plane is not asked (no mint record, no refusal record of its own).
  t.equal((await cph.call('root', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: true })).status, 200);
  t.ok(await until(async () => (await getAgent(h.broker.deps.db, 'bot-1'))?.contained === true), 'contained');
  const records = cph.audit.filter((r) => r.action === 'agent-operator-token.mint').length;
  t.equal((await mint('bot-1')).status, 403);
  t.equal(
    cph.audit.filter((r) => r.action === 'agent-operator-token.mint').length,
    records,
    'the control plane was not asked',
  );
  t.equal((await cph.call('root', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: false })).status, 200);
  t.ok(await until(async () => (await getAgent(h.broker.deps.db, 'bot-1'))?.contained === false), 'released');

  // A broker key the control plane does not know: a 502, not the control plane's 401 (the satellite's
  // token is fine). A control plane that is gone: a 502 too.
  await h.broker.close();
  await h.restart({ ...withCp, brokerKey: 'dvxb_not-the-key' });
  const refused = await mint('bot-1');
  t.equal(refused.status, 502);
  t.match(refused.body, { type: 'https://dvx.dev/problems/controlplane-unavailable', detail: /answered 401/ });
  await relay.cut();
  const down = await mint('bot-1');
  t.equal(down.status, 502, 'the control plane unreachable');
  t.match(down.body.detail, /did not answer/);
  for (const key of [brokerKey, 'dvxb_not-the-key'])
    t.notOk(h.logs.join('\n').includes(key), 'the broker key is in no log line');
});
