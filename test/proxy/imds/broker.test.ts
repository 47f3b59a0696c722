import t from 'tap';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { until } from '../../fixtures/eventually.ts';
import { broker, freePort, put } from '../llm/secret-broker-fixture.ts';
import { get, startHarness, tempDir } from './imds-fixture.ts';

// imds with `--secret-broker-url`: a real broker (satellite routes over TLS, secrets authored on its
// operator listener) is the secret source, read with the satellite token and followed through its
// events, exactly as llmproxy reads it (proxy/llm/secret-broker.ts).

const AGENT_VALUE = 'ghp_from-the-broker-agent-1-xyz';
const GROUP_VALUE = 'group-scoped-broker-value-123';
const NEW_VALUE = 'ghp_rotated-by-the-operator-456';

t.test('credentials come from the broker and follow its changes', async (t) => {
  const port = await freePort();
  const b = await broker(port);
  t.teardown(() => b.close());
  t.equal((await put(b, 'gh_token', AGENT_VALUE, '?agent=agent-1')).status, 200);

  const h = await startHarness(t, {
    secretsFile: '',
    secretBrokerUrl: `https://127.0.0.1:${port}`,
    secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
    brokerCa: b.caFile,
    injectCred: [
      'host=api.github.com,header=Authorization,secret=gh_token,format=Bearer {}',
      'host=db.internal,header=X-Db,secret=db_password',
    ],
  });

  const first = await get(h.socket, '/v1/credentials/gh_token');
  t.equal(first.status, 200);
  t.same(first.json, {
    name: 'gh_token',
    header: 'authorization',
    value: `Bearer ${AGENT_VALUE}`,
    hosts: ['api.github.com'],
  });

  const missing = await get(h.socket, '/v1/credentials/db_password');
  t.equal(missing.status, 404);
  t.match(missing.json.error.message, /secret "db_password"/);

  // The operator writes the secret at the agent's group (g-1): the broker merges it for the agent.
  t.equal((await put(b, 'db_password', GROUP_VALUE, '?group=g-1')).status, 200);
  t.ok(
    await until(async () => (await get(h.socket, '/v1/credentials/db_password')).json?.value === GROUP_VALUE, 5000),
    "the group's secret, followed through the broker's events",
  );
  t.equal((await put(b, 'gh_token', NEW_VALUE, '?agent=agent-1')).status, 200);
  t.ok(
    await until(
      async () => (await get(h.socket, '/v1/credentials/gh_token')).json?.value === `Bearer ${NEW_VALUE}`,
      5000,
    ),
    'a rotated value',
  );
  for (const v of [AGENT_VALUE, GROUP_VALUE, NEW_VALUE]) t.notOk(h.logs.join('\n').includes(v), 'never logged');
});

t.test('a broker that has not answered yet: 503, not a missing secret', async (t) => {
  const port = await freePort(); // nothing listens there
  const tokenFile = join(await tempDir(t), 'token');
  await writeFile(tokenFile, 'satellite-token');
  const h = await startHarness(t, {
    secretsFile: '',
    secretBrokerUrl: `https://127.0.0.1:${port}`,
    secretBrokerTokenFile: tokenFile,
    injectCred: ['host=api.github.com,header=Authorization,secret=gh_token'],
  });
  const res = await get(h.socket, '/v1/credentials/gh_token');
  t.equal(res.status, 503);
  t.match(res.json.error, { type: 'secrets_unavailable', message: /secret broker has not answered/ });
  t.equal((await get(h.socket, '/v1/credentials')).status, 200, 'the rules are still listed');
});
