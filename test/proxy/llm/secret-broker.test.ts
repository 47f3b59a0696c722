import t from 'tap';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { until } from '../../fixtures/eventually.ts';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';
import {
  AGENT_KEY,
  AGENT_KEY_2,
  broker,
  DB_PASSWORD,
  freePort,
  GROUP_KEY,
  keyOf,
  ORG_KEY_1,
  ORG_KEY_2,
  put,
  snapshot,
  VALUES,
} from './secret-broker-fixture.ts';

// llmproxy with `--secret-broker-url`: a real broker (its operator listener behind a real OIDC issuer,
// its satellite routes over TLS) holds the secrets, a real llmproxy reads them with the satellite token
// and follows the broker's events, and a real upstream shows which key each call carried. A broker
// unreachable at start: secret-broker-start.test.ts; the options and --broker-ca: secret-broker-options.test.ts.

t.test('the broker holds the keys; llmproxy follows every change', async (t) => {
  const port = await freePort();
  const b = await broker(port);
  t.teardown(() => b.close());
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_1)).status, 200);

  const p = await startHarness({
    snapshot,
    proxy: {
      secretsFile: '',
      secretBrokerUrl: `https://127.0.0.1:${port}`,
      secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
      brokerCa: b.caFile,
    },
  });
  t.teardown(() => p.close());

  t.equal(await keyOf(p, 'agent-2'), ORG_KEY_1, 'the org key the broker holds, loaded at start');

  // The operator changes it: the next calls carry the new key within moments (the broker's event, not
  // the 30-second safety net).
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_2)).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === ORG_KEY_2, 3000), 'the new org key, event-driven');

  // An agent-scope key beats the org's; a group-scope key beats the org's for that group's agents.
  t.equal((await put(b, 'agent:llmproxy.llm.api_key', AGENT_KEY, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === AGENT_KEY, 3000), "agent-1's own key");
  t.equal(await keyOf(p, 'agent-2'), ORG_KEY_2, 'agent-2 keeps the org key');
  t.equal((await put(b, 'llmproxy:llm.api_key', GROUP_KEY, '?group=g-2')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === GROUP_KEY, 3000), "agent-2's group key");
  t.equal(await keyOf(p, 'agent-1'), AGENT_KEY, 'agent-1 keeps its own');

  // The secrets filter's needles come from the broker: an agent's own secret in a request is found.
  const leak = () => post(p, '/v1/messages', anthropicBody(`the password is ${DB_PASSWORD}`));
  t.equal((await leak()).status, 200, 'not a secret of the agent yet');
  t.equal((await put(b, 'db_password', DB_PASSWORD, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await leak()).status === 403, 3000), 'blocked once the broker holds it');
  t.match(p.audit.at(-1), { findings: [{ inspector_type: 'secrets', location: 'request_body' }] });

  // The broker stops: llmproxy keeps the last good copy. It comes back: llmproxy reconnects and follows.
  await b.broker.close();
  t.equal(await keyOf(p, 'agent-1'), AGENT_KEY, 'served from the last good copy while the broker is down');
  await b.restart();
  t.equal((await put(b, 'agent:llmproxy.llm.api_key', AGENT_KEY_2, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === AGENT_KEY_2, 25_000), 'followed after a reconnect');
  t.equal(
    (await b.operator('admin-1', 'DELETE', '/api/v1/secrets/agent%3Allmproxy.llm.api_key?agent=agent-1')).status,
    204,
  );
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === ORG_KEY_2, 3000), 'deleted: back to the org key');

  // No value in any log line of either, nor in any audit record of either (the proxy's findings carry a
  // redacted prefix only).
  for (const v of VALUES) {
    t.notOk(b.logs.join('\n').includes(v), 'not in a broker log line');
    t.notOk(JSON.stringify(b.audit).includes(v), 'not in a broker audit record');
    t.notOk(JSON.stringify(p.logs).includes(v), 'not in an llmproxy log line');
    t.notOk(JSON.stringify(p.audit).includes(v), 'not in an llmproxy audit record');
  }
  t.notOk(
    JSON.stringify(p.logs).includes((await readFile(join(b.dir, 'state', 'satellite-token'), 'utf8')).trim()),
    'nor the satellite token',
  );
});
