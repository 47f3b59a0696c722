import t from 'tap';
import type { Test } from 'tap';
import { agentSecrets, allSecretsOf, secretsVersion } from '../../../enclave/broker/secrets.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { addAgent } from './secrets-fixture.ts';

// The enclave's secrets on the operator listener, behind a real OIDC issuer and the enclave's own
// grants, on PGlite and on PostgreSQL: scopes, the merge an agent sees, sealing at rest, the version
// and its bus event, audit records that name secrets and never their values, and bad input as 400s.

const VALUES = {
  orgKey: 'sk-org-key-value-0123456789',
  orgDb: 'org-db-password-value',
  groupDb: 'group-db-password-value',
  agentDb: 'agent-db-password-value',
  agentKey: 'sk-agent-key-value-0123456789',
};

const PERSONAS = [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'bob', org: 'org-a', human: true },
  { clientId: 'admin-b', org: 'org-b', human: true },
];

async function routes(t: Test, h: BrokerHarness) {
  const db = h.broker.deps.db;
  await addAgent(h, 'agent-1', 'org-a', 'g-1');
  await addAgent(h, 'agent-2', 'org-a', null);
  await addAgent(h, 'agent-b', 'org-b', 'g-1');
  await db.query(
    `INSERT INTO broker_grants (principal, role, org_id) VALUES ('user:admin-b', 'admin', 'org-b') ON CONFLICT DO NOTHING`,
  );
  const versions: number[] = [];
  h.broker.deps.bus.on('secrets', (v) => versions.push(v));
  const v0 = await secretsVersion(db);

  t.equal((await h.operator(null, 'GET', '/api/v1/secrets')).status, 401, 'no token');
  const bob = await h.operator('bob', 'PUT', '/api/v1/secrets/x', { value: 'whatever-value' });
  t.equal(bob.status, 403, 'no secrets:manage');
  t.match(bob.body.detail, /secrets:manage/);
  t.equal((await h.operator('bob', 'GET', '/api/v1/secrets')).status, 403);
  t.equal(
    (await h.operator('bob', 'PUT', '/api/v1/secrets/a%20b', { nope: 1 })).status,
    403,
    'the capability is checked before the body',
  );

  const put = (name: string, value: unknown, q = '', persona = 'admin-a') =>
    h.operator(persona, 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });
  const org = await put('llmproxy:llm.api_key', VALUES.orgKey);
  t.equal(org.status, 200);
  t.same(org.body, { name: 'llmproxy:llm.api_key', scope: 'org:org-a' }, 'the name and scope, never the value');
  t.same((await put('db_password', VALUES.orgDb)).body, { name: 'db_password', scope: 'org:org-a' });
  t.same((await put('db_password', VALUES.groupDb, '?group=g-1')).body, {
    name: 'db_password',
    scope: 'group:org-a:g-1',
  });
  t.same((await put('db_password', VALUES.agentDb, '?agent=agent-1')).body, {
    name: 'db_password',
    scope: 'agent:agent-1',
  });
  t.same((await put('agent:llmproxy.llm.api_key', VALUES.agentKey, '?agent=agent-1')).body, {
    name: 'agent:llmproxy.llm.api_key',
    scope: 'agent:agent-1',
  });
  t.equal((await put('db_password', 'org-b-value-123', '', 'admin-b')).status, 200, "another org's own secret");

  // An agent scope is an agent of the caller's org that the broker knows.
  t.equal((await put('x', 'value-1234', '?agent=nobody')).status, 404, 'unknown agent');
  t.equal((await put('x', 'value-1234', '?agent=agent-b')).status, 404, "another org's agent");

  // Garbage is a 400 naming what is wrong; nothing is stored.
  const long = 'n'.repeat(200);
  t.equal((await put(long, 'value-1234')).status, 200, 'a 200-character name (past the router parameter limit)');
  for (const [what, res, detail] of [
    ['both scopes', await put('x', 'value-1234', '?agent=agent-1&group=g-1'), /mutually exclusive/],
    ['a space', await put('a b', 'value-1234'), /name: must be/],
    ['a slash', await put('a/b', 'value-1234'), /name: must be/],
    ['201 characters', await put('n'.repeat(201), 'value-1234'), /name: must be/],
    ['non-ASCII', await put('pässword', 'value-1234'), /name: must be/],
    ['an empty value', await put('x', ''), /value: must not be empty/],
    ['a value past 64 KiB', await put('x', 'v'.repeat(64 * 1024 + 1)), /value: must be at most 65536 bytes/],
    ['a number', await put('x', 42), /value: must be a string/],
    ['an empty group', await put('x', 'value-1234', '?group='), /group: must be/],
    ['an unknown query', await put('x', 'value-1234', '?org=org-b'), /org: unknown query parameter/],
    ['two agents', await put('x', 'value-1234', '?agent=agent-1&agent=agent-2'), /agent: must be a string/],
    ['a NUL in the value', await put('x', 'a\u0000b-value'), /NUL/],
    [
      'no value',
      await h.operator('admin-a', 'PUT', '/api/v1/secrets/x', { other: 'y' }),
      /value: is required|other: unknown field/,
    ],
    ['not JSON', await h.operator('admin-a', 'PUT', '/api/v1/secrets/x', '{"value":'), /JSON|body/i],
  ] as const) {
    t.equal(res.status, 400, what);
    t.match(res.type, /^application\/problem\+json/, what);
    t.match(res.body.detail, detail, what);
  }
  const huge = await put('x', 'v'.repeat(2 * 1024 * 1024));
  t.equal(huge.status, 413, 'a body past the route limit');
  t.equal(
    (await db.query(`SELECT 1 FROM broker_secrets WHERE name = 'x'`)).rows.length,
    0,
    'no refused write stored anything',
  );

  // The listing: names, scopes and times of the caller's org only, never a value.
  const list = await h.operator('admin-a', 'GET', '/api/v1/secrets');
  t.equal(list.status, 200);
  t.same(
    list.body.map((s: { name: string; scope: string }) => `${s.scope} ${s.name}`),
    [
      'org:org-a db_password',
      'org:org-a llmproxy:llm.api_key',
      `org:org-a ${long}`,
      'group:org-a:g-1 db_password',
      'agent:agent-1 agent:llmproxy.llm.api_key',
      'agent:agent-1 db_password',
    ],
  );
  for (const s of list.body) t.ok(!Number.isNaN(Date.parse(s.updated_at)), 'updated_at is a time');
  for (const v of Object.values(VALUES)) t.notOk(JSON.stringify(list.body).includes(v), 'no value in the listing');

  // What an agent resolves: agent over group over org; its own view drops the satellite names.
  const deps = h.broker.deps;
  const a1 = { uid: 'agent-1', org_id: 'org-a', group_id: 'g-1' };
  const a2 = { uid: 'agent-2', org_id: 'org-a', group_id: null };
  t.same(
    { ...(await allSecretsOf(deps, a1)) },
    {
      'llmproxy:llm.api_key': VALUES.orgKey,
      db_password: VALUES.agentDb,
      'agent:llmproxy.llm.api_key': VALUES.agentKey,
      [long]: 'value-1234',
    },
  );
  t.same({ ...(await agentSecrets(deps, a1)) }, { db_password: VALUES.agentDb, [long]: 'value-1234' });
  t.same({ ...(await agentSecrets(deps, a2)) }, { db_password: VALUES.orgDb, [long]: 'value-1234' }, 'no group: org');
  t.same(
    { ...(await agentSecrets(deps, { uid: 'agent-3', org_id: 'org-a', group_id: 'g-1' })) },
    { db_password: VALUES.groupDb, [long]: 'value-1234' },
    'the group over the org',
  );
  t.same(
    { ...(await agentSecrets(deps, { uid: 'agent-b', org_id: 'org-b', group_id: 'g-1' })) },
    {
      db_password: 'org-b-value-123',
    },
  );

  // Sealed at rest: the store holds no plaintext.
  const stored = (await db.query<{ sealed: string }>('SELECT sealed FROM broker_secrets')).rows;
  t.equal(stored.length, 7, 'six of org-a, one of org-b');
  for (const { sealed } of stored) {
    t.match(sealed, /^dk1:/);
    for (const v of [...Object.values(VALUES), 'value-1234', 'org-b-value-123']) t.notOk(sealed.includes(v));
  }

  // Deleting: 204, then 404; another org's scope is not reachable.
  const del = (name: string, q = '') =>
    h.operator('admin-a', 'DELETE', `/api/v1/secrets/${encodeURIComponent(name)}${q}`);
  t.equal((await del('db_password', '?group=g-1')).status, 204);
  t.equal((await del('db_password', '?group=g-1')).status, 404);
  t.equal((await del('db_password', '?agent=agent-b')).status, 404, "another org's agent");
  t.equal((await del('a b')).status, 400);
  t.equal((await del('x', '?agent=agent-1&group=g-1')).status, 400);
  t.equal((await del(long)).status, 204);
  t.same(
    { ...(await agentSecrets(deps, { uid: 'agent-3', org_id: 'org-a', group_id: 'g-1' })) },
    { db_password: VALUES.orgDb },
  );
  t.same(
    (await h.operator('admin-b', 'GET', '/api/v1/secrets')).body.map((s: { scope: string }) => s.scope),
    ['org:org-b'],
    'org-b sees its own only',
  );

  // Each write bumped the version once and announced it after its commit.
  const v = await secretsVersion(db);
  t.equal(v, v0 + 9, '7 puts and 2 deletes');
  t.same(
    versions,
    Array.from({ length: 9 }, (_, i) => v0 + i + 1),
  );

  // Audit: every write and delete, naming the secret and scope; no value anywhere in audit or logs.
  const puts = h.audit.filter((r) => r.action === 'secret.put');
  const dels = h.audit.filter((r) => r.action === 'secret.delete');
  t.equal(puts.length, 7);
  t.equal(dels.length, 2);
  t.match(puts[0], {
    actor: 'admin-a',
    org_id: 'org-a',
    outcome: 'allow',
    resource: 'secret:org:org-a:llmproxy:llm.api_key',
    attrs: { secret: 'llmproxy:llm.api_key', secret_scope: 'org:org-a' },
    source: 'broker',
    enclave_id: 'enc-test',
  });
  t.match(dels[0], { resource: 'secret:group:org-a:g-1:db_password' });
  for (const v of [...Object.values(VALUES), 'value-1234', 'org-b-value-123']) {
    t.notOk(JSON.stringify(h.audit).includes(v), 'no value in an audit record');
    t.notOk(h.logs.join('\n').includes(v), 'no value in a log line');
  }
}

t.test('secrets on the operator listener (PGlite)', async (t) => {
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, PERSONAS);
  t.teardown(() => h.close());
  await routes(t, h);
});

t.test('secrets on the operator listener (PostgreSQL)', async (t) => {
  const pg = await freshPgDatabase('dvx_broker_secrets');
  if (!pg) {
    if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
    return;
  }
  t.teardown(() => pg.drop());
  const h = await startBrokerHarness({ databaseDsn: pg.dsn, seedAdmin: ['admin-a'] }, PERSONAS);
  t.teardown(() => h.close());
  await routes(t, h);
});

t.test('concurrent writes each get their own version', async (t) => {
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, PERSONAS);
  t.teardown(() => h.close());
  const before = await secretsVersion(h.broker.deps.db);
  const seen: number[] = [];
  h.broker.deps.bus.on('secrets', (v) => seen.push(v));
  const answers = await Promise.all(
    Array.from({ length: 8 }, (_, i) =>
      h.operator('admin-a', 'PUT', `/api/v1/secrets/k${i}`, { value: `value-${i}-xyz` }),
    ),
  );
  t.same(
    answers.map((a) => a.status),
    Array(8).fill(200),
  );
  t.equal(await secretsVersion(h.broker.deps.db), before + 8);
  t.same(
    [...seen].sort((a, b) => a - b),
    Array.from({ length: 8 }, (_, i) => before + i + 1),
    'eight distinct versions',
  );
});
