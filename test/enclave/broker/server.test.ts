import t from 'tap';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { startBroker } from '../../../enclave/broker/server.ts';
import { validateBrokerOptions } from '../../../enclave/broker/options.ts';
import { BrokerOptionsError } from '../../../enclave/errors.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';

// The broker's two TLS listeners, its state under --state-dir, its sealer across restarts, and the
// enclave's own grants on the operator listener, behind a real OIDC issuer.

t.test('both listeners answer over TLS; state lives under --state-dir', async (t) => {
  const h = await startBrokerHarness();
  t.teardown(() => h.close());
  const agent = await h.agent('GET', '/healthz');
  t.equal(agent.status, 200);
  t.match(agent.body, { component: 'broker', status: 'ok', enclave_id: 'enc-test', enclave_name: 'test-enclave' });
  const op = await h.operator(null, 'GET', '/healthz');
  t.match(op.body, { component: 'broker-operator', status: 'ok' });
  const missing = await h.agent('GET', '/nope');
  t.equal(missing.status, 404);
  t.match(missing.type, /^application\/problem\+json/);
  const stateDir = join(h.dir, 'state');
  t.equal((await stat(stateDir)).mode & 0o777, 0o700, 'the state directory is private');
  t.equal((await stat(join(stateDir, 'kms-key.json'))).mode & 0o777, 0o600, 'the KMS key is 0600');
  t.ok((await stat(join(stateDir, 'db'))).isDirectory(), 'PGlite under --state-dir');
});

t.test('without --local-issuer every operator API path is refused 401 as a Problem', async (t) => {
  const h = await startBrokerHarness();
  t.teardown(() => h.close());
  const res = await h.operator(null, 'GET', '/api/v1/grants');
  t.equal(res.status, 401);
  t.match(res.type, /^application\/problem\+json/);
  t.match(res.body.detail, /no --local-issuer/);
});

t.test('a value sealed before a restart opens after it (the data key is kept, wrapped)', async (t) => {
  const h = await startBrokerHarness();
  t.teardown(() => h.close());
  const sealed = await h.broker.deps.sealer.seal('sk-ant-very-secret-value');
  t.notMatch(sealed, /very-secret/, 'sealed bytes do not show the value');
  await h.broker.close();
  await h.restart();
  t.equal(await h.broker.deps.sealer.open(sealed), 'sk-ant-very-secret-value');
  await t.rejects(h.broker.deps.sealer.open('dk1:unknown:AAAA'), /data key unknown/);
  await t.rejects(h.broker.deps.sealer.open('plain text'), /not a value sealed/);
});

t.test('options are checked before anything starts', async (t) => {
  t.throws(() => validateBrokerOptions({}), BrokerOptionsError);
  const tls = { tlsCert: 'c', tlsKey: 'k' };
  t.throws(() => validateBrokerOptions({ ...tls, controlplane: 'https://cp' }), /--broker-key/);
  t.throws(() => validateBrokerOptions({ ...tls, controlplane: 'https://cp', brokerKey: 'x' }), /--enclave-id/);
  t.throws(() => validateBrokerOptions({ ...tls, controlplane: 'ftp://cp' }), /absolute http/);
  t.throws(() => validateBrokerOptions({ ...tls, localIssuer: 'http://idp.example' }), /https/);
  t.throws(() => validateBrokerOptions({ ...tls, localIssuer: 'https://idp.example' }), /--owning-org/);
  t.throws(() => validateBrokerOptions({ ...tls, seedAdmin: ['alice'] }), /--owning-org/);
  t.throws(() => validateBrokerOptions({ ...tls, databaseDsn: 'mysql://x' }), /--database-dsn/);
  t.throws(() => validateBrokerOptions({ ...tls, keyRotation: 60_000 }), /at least 15m/);
  const o = validateBrokerOptions({ ...tls, stateDir: '/s' });
  t.same(
    [o.databaseDsn, o.agentHostDir, o.enclaveCaCert, o.kmsConfig, o.satelliteTokenFile],
    ['pglite:///s/db', '/s/agents', '/s/enclave-ca.pem', '/s/kms-key.json', '/s/satellite-token'],
  );
  await t.rejects(startBroker({ ...tls }), /cannot read|TLS|--tls-cert/, 'unreadable TLS material is refused');
});

t.test('the enclave grants on the operator listener (PostgreSQL)', async (t) => {
  const pg = await freshPgDatabase('dvx_broker_srv');
  if (!pg) {
    if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
    return;
  }
  t.teardown(() => pg.drop());
  const h = await startBrokerHarness({ databaseDsn: pg.dsn, seedAdmin: ['admin-a'] }, [
    { clientId: 'admin-a', org: 'org-a', human: true },
    { clientId: 'bob', org: 'org-a', human: true },
    { clientId: 'eve', org: 'org-b', human: true },
  ]);
  t.teardown(() => h.close());

  t.equal((await h.operator(null, 'GET', '/api/v1/grants')).status, 401, 'no token');
  t.equal((await h.operator(null, 'GET', '/api/v1/unknown')).status, 401, 'an unknown path is 401, not 404');
  const none = await h.operator('bob', 'GET', '/api/v1/grants');
  t.equal(none.status, 403, 'no local grant: 403');
  t.match(none.body.detail, /members:\*/);

  const seeded = await h.operator('admin-a', 'GET', '/api/v1/grants');
  t.equal(seeded.status, 200);
  t.match(seeded.body, [{ principal: 'user:admin-a', role: 'admin', scope_kind: 'org', org_id: 'org-a' }]);

  const made = await h.operator('admin-a', 'POST', '/api/v1/grants', { principal: 'user:bob', role: 'auditor' });
  t.equal(made.status, 201);
  t.match(made.body, { principal: 'user:bob', role: 'auditor', org_id: 'org-a' });
  t.equal(
    (await h.operator('admin-a', 'POST', '/api/v1/grants', { principal: 'user:bob', role: 'auditor' })).status,
    409,
  );
  t.match(
    h.audit.find((r) => r.action === 'grant.create'),
    {
      actor: 'admin-a',
      org_id: 'org-a',
      outcome: 'allow',
      enclave_id: 'enc-test',
      source: 'broker',
    },
  );

  // Bad bodies are 400 naming the field; a role that is not one, or `constructor`, is unknown.
  for (const [body, detail] of [
    [{ role: 'auditor' }, /principal/],
    [{ principal: 'bob', role: 'auditor' }, /principal: must be/],
    [{ principal: 'user:x' }, /exactly one/],
    [{ principal: 'user:x', role: 'auditor', capability: 'audit:read' }, /exactly one/],
    [{ principal: 'user:x', role: 'constructor' }, /unknown role/],
    [{ principal: 'user:x', capability: 'platform:config' }, /unknown capability/],
    [{ principal: 'user:x', role: 'auditor', extra: 1 }, /extra/],
  ] as const) {
    const res = await h.operator('admin-a', 'POST', '/api/v1/grants', body);
    t.equal(res.status, 400, JSON.stringify(body));
    t.match(res.body.detail, detail);
  }
  // Another org's caller sees none of org-a's grants and cannot delete them.
  t.equal((await h.operator('eve', 'GET', '/api/v1/grants')).status, 403);
  // bob (auditor) cannot grant.
  t.equal((await h.operator('bob', 'POST', '/api/v1/grants', { principal: 'user:eve', role: 'member' })).status, 403);
  t.equal((await h.operator('admin-a', 'DELETE', `/api/v1/grants/${made.body.id}`)).status, 204);
  t.equal((await h.operator('admin-a', 'DELETE', `/api/v1/grants/${made.body.id}`)).status, 404);
  t.equal((await h.operator('admin-a', 'DELETE', '/api/v1/grants/abc')).status, 404);
});
