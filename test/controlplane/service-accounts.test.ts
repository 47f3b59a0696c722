import t from 'tap';
import type { AuditSink } from '../../audit-wal/sink.ts';
import {
  parseServiceAccountKey,
  tokenRequestForm,
  type ServiceAccountKey,
} from '../../controlplane/idp/service-account-key.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { AUDIENCE } from '../fixtures/oidc-issuer.ts';
import pg from 'pg';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// Service accounts end to end against a real IdP (oidc-provider, dynamic client registration): the key
// handed out once mints a token through the control plane's own POST /oauth/token facade, and that
// token is a `service` principal holding exactly what was granted.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'admin-a', org: 'org-a' },
    { clientId: 'alice', org: 'org-a' },
    { clientId: 'admin-b', org: 'org-b' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const cp = await h.start({ seedAdmin: ['root'], tokenEndpointOverride: `${h.issuer.issuer}/token` });
t.teardown(() => cp.close());
const call = (who: string, method: string, path: string, body?: unknown) => h.callAt(cp.port, who, method, path, body);

/** The token a key file mints through the facade (client credentials, private_key_jwt). */
async function mint(key: ServiceAccountKey): Promise<{ status: number; body: any }> {
  const form = await tokenRequestForm(key, { resource: AUDIENCE, scope: 'api' });
  const res = await h.rawAt(cp.port, 'POST', '/oauth/token', form.toString(), {
    'content-type': 'application/x-www-form-urlencoded',
  });
  return { status: res.status, body: JSON.parse(res.text) };
}
async function as(token: string, method: string, path: string, body?: unknown) {
  const res = await h.rawAt(cp.port, method, `/api/v1${path}`, body === undefined ? undefined : JSON.stringify(body), {
    authorization: `Bearer ${token}`,
    ...(body === undefined ? {} : { 'content-type': 'application/json' }),
  });
  return { status: res.status, body: res.text ? JSON.parse(res.text) : null };
}

await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'POST', '/orgs', { id: 'org-b', name: 'B' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
await call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });

t.test('org-created: the key is shown once, mints a token, and the account holds what it is granted', async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'ci-bot' });
  t.equal(created.status, 201);
  t.match(created.body, {
    id: String,
    owner: 'admin-a',
    level: 'org',
    status: 'active',
    org_id: 'org-a',
    created_at: /^\d{4}-\d\d-\d\dT/,
  });
  const key = parseServiceAccountKey(created.body.credential);
  t.equal(key.client_id, created.body.id);
  t.ok(key.key.d, 'the private key is in the credential');
  const id = created.body.id as string;

  const got = await call('admin-a', 'GET', `/orgs/org-a/service-accounts/${id}`);
  t.same(
    Object.keys(got.body).sort(),
    ['created_at', 'id', 'level', 'org_id', 'owner', 'status'],
    'never again the credential',
  );
  t.notOk(
    JSON.stringify((await call('admin-a', 'GET', '/orgs/org-a/service-accounts')).body).includes(String(key.key.d)),
    'nor in the list',
  );

  const token = await mint(key);
  t.equal(token.status, 200, JSON.stringify(token.body));
  const who = await as(token.body.access_token, 'GET', '/whoami');
  t.same(who.body, { subject: id, kind: 'service', org_id: 'org-a', groups: [], capabilities: [] });
  t.equal((await as(token.body.access_token, 'GET', '/orgs/org-a/members')).status, 403, 'nothing granted yet');

  const grant = await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${id}/grants`, { capability: 'members:*' });
  t.equal(grant.status, 201);
  t.same(grant.body, {
    id: grant.body.id,
    role: null,
    capability: 'members:*',
    scope_kind: 'org',
    org_id: 'org-a',
    group_id: '',
    agent_id: '',
  });
  t.equal((await as(token.body.access_token, 'GET', '/orgs/org-a/members')).status, 200, 'the grant applies at once');
  t.equal((await as(token.body.access_token, 'GET', '/orgs/org-b/members')).status, 403, 'in its own org only');
  t.same((await call('admin-a', 'GET', `/orgs/org-a/service-accounts/${id}/grants`)).body, [grant.body]);
  t.equal((await call('admin-a', 'DELETE', `/orgs/org-a/service-accounts/${id}/grants/${grant.body.id}`)).status, 204);
  t.equal((await as(token.body.access_token, 'GET', '/orgs/org-a/members')).status, 403, 'revoked at once');
  t.equal((await call('admin-a', 'DELETE', `/orgs/org-a/service-accounts/${id}/grants/${grant.body.id}`)).status, 404);
  t.ok(
    h.audit.some(
      (r) => r.action === 'service-account.create' && r.resource === `service-account:${id}` && r.actor === 'admin-a',
    ),
    'audited',
  );
});

t.test('keys: a new key mints, a removed key no longer does', async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'rotator' });
  const id = created.body.id as string;
  const first = parseServiceAccountKey(created.body.credential);
  const added = await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${id}/keys`);
  t.equal(added.status, 201);
  t.same(Object.keys(added.body).sort(), ['credential', 'id']);
  const second = parseServiceAccountKey(added.body.credential);
  t.not(second.key_id, first.key_id);
  t.equal((await mint(second)).status, 200, 'the new key works');
  t.equal((await mint(first)).status, 200, 'the old one still does');
  t.equal((await call('admin-a', 'DELETE', `/orgs/org-a/service-accounts/${id}/keys/${first.key_id}`)).status, 204);
  const refused = await mint(first);
  t.equal(refused.status, 401, 'the IdP no longer accepts the removed key');
  t.equal(refused.body.error, 'invalid_client');
  t.equal((await mint(second)).status, 200);
  t.equal((await call('admin-a', 'DELETE', `/orgs/org-a/service-accounts/${id}/keys/${first.key_id}`)).status, 404);
});

t.test('self-service: a member passes on only what they hold, for groups they are in', async (t) => {
  await call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
  await call('root', 'POST', '/orgs/org-a/groups', { id: 'dev', name: 'Dev' });
  await call('root', 'PUT', '/orgs/org-a/members/alice', { username: 'alice' });
  await call('root', 'PUT', '/orgs/org-a/groups/ops/members/alice');
  await call('root', 'POST', '/orgs/org-a/grants', {
    principal: 'user:alice',
    capability: 'agents:manage',
    group: 'ops',
  });

  const over = await call('alice', 'POST', '/orgs/org-a/service-accounts/self-service', {
    name: 'mine',
    grants: [{ capability: 'agents:manage' }],
  });
  t.equal(over.status, 403, 'org-wide is more than she holds');
  t.match(over.body.detail, /grants\[0\]: you do not hold agents:manage over org org-a/);
  t.equal(
    (
      await call('alice', 'POST', '/orgs/org-a/service-accounts/self-service', {
        name: 'mine',
        grants: [{ capability: 'members:*' }],
      })
    ).status,
    403,
  );
  t.match(
    (await call('alice', 'POST', '/orgs/org-a/service-accounts/self-service', { name: 'mine', groups: ['dev'] })).body,
    { status: 400, detail: /^groups\[0\]: you are not a member of group dev/ },
  );
  t.equal(
    (await call('admin-b', 'POST', '/orgs/org-a/service-accounts/self-service', { name: 'x' })).status,
    403,
    'members of the org only',
  );

  const ok = await call('alice', 'POST', '/orgs/org-a/service-accounts/self-service', {
    name: 'mine',
    groups: ['ops'],
    grants: [{ capability: 'agents:manage', group: 'ops' }],
  });
  t.equal(ok.status, 201, JSON.stringify(ok.body));
  t.match(ok.body, { owner: 'alice', level: 'self-service', status: 'active' });
  const id = ok.body.id as string;
  const token = (await mint(parseServiceAccountKey(ok.body.credential))).body.access_token;
  const who = await as(token, 'GET', '/whoami');
  t.same([who.body.groups, who.body.capabilities], [['ops'], ['agents:manage']]);
  t.equal(
    (await call('alice', 'GET', `/orgs/org-a/service-accounts/${id}`)).status,
    200,
    'the owner reads her account',
  );
  t.equal((await call('alice', 'POST', `/orgs/org-a/service-accounts/${id}/keys`)).status, 201, 'and adds keys');
  t.equal(
    (await call('alice', 'GET', '/orgs/org-a/service-accounts')).status,
    403,
    'but lists only with clients:manage',
  );
  t.equal(
    (await call('alice', 'POST', `/orgs/org-a/service-accounts/${id}/grants`, { capability: 'members:*' })).status,
    403,
    'and grants nothing herself',
  );

  // Transfer of the owner: to a member of the org only.
  t.match((await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${id}/transfer`, { owner: 'stranger' })).body, {
    status: 400,
    detail: /^owner: stranger is not a member/,
  });
  await call('root', 'PUT', '/orgs/org-a/members/bob', {});
  const moved = await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${id}/transfer`, { owner: 'bob' });
  t.match(moved.body, { id, owner: 'bob' });
  t.equal((await call('alice', 'GET', `/orgs/org-a/service-accounts/${id}`)).status, 403, 'no longer hers');
});

t.test('disable: the IdP client is gone and the tokens it holds are refused', async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'leaver' });
  const key = parseServiceAccountKey(created.body.credential);
  const token = (await mint(key)).body.access_token;
  t.equal((await as(token, 'GET', '/whoami')).status, 200);
  const disabled = await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/disable`);
  t.match(disabled.body, { id: created.body.id, status: 'disabled' });
  const refused = await as(token, 'GET', '/whoami');
  t.equal(refused.status, 401);
  t.match(refused.body.detail, /disabled/);
  t.equal((await mint(key)).status, 401, 'no new token');
  t.equal(
    (await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/disable`)).status,
    200,
    'disabling twice is harmless',
  );
  t.equal(
    (await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/keys`)).status,
    409,
    'no keys for a disabled account',
  );
});

t.test('other orgs and bad input', async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'private' });
  t.equal((await call('admin-b', 'GET', `/orgs/org-a/service-accounts/${created.body.id}`)).status, 403);
  t.equal(
    (await call('admin-b', 'GET', `/orgs/org-b/service-accounts/${created.body.id}`)).status,
    404,
    'not in org-b',
  );
  t.equal((await call('admin-b', 'GET', '/orgs/org-a/service-accounts/nope')).status, 403, 'existence is not revealed');
  t.match((await call('admin-a', 'POST', '/orgs/org-a/service-accounts', {})).body, {
    status: 400,
    detail: /^name: is required/,
  });
  t.match((await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'x', owner: 'y' })).body, {
    status: 400,
    detail: /^owner: unknown field/,
  });
  t.match(
    (
      await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/grants`, {
        role: 'platform-admin',
      })
    ).body,
    { status: 400, detail: /^role:/ },
  );
  t.match(
    (await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/grants`, { capability: 'fly' }))
      .body,
    { status: 400, detail: /^capability: unknown/ },
  );
  t.match(
    (
      await call('admin-a', 'POST', '/orgs/org-a/service-accounts/self-service', {
        name: 'x',
        grants: [{ capability: 'audit:read', group: 'ops', agent: 'a1' }],
      })
    ).body,
    { status: 400, detail: /^grants\[0\]\.agent:/ },
  );
});

t.test("a service account's grant confers only what the granting caller holds", async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/service-accounts', { name: 'escalator' });
  t.equal(created.status, 201);
  const path = `/orgs/org-a/service-accounts/${created.body.id}/grants`;
  for (const body of [{ capability: 'platform:config' }, { capability: 'platform:audit:read', group: 'ops' }]) {
    const r = await call('admin-a', 'POST', path, body);
    t.equal(r.status, 403, JSON.stringify(body));
    t.match(r.body, {
      type: 'https://dvx.dev/problems/forbidden',
      detail: new RegExp(`confers ${body.capability} over`),
    });
  }
  t.same((await call('admin-a', 'GET', path)).body, [], 'nothing was granted');
  t.equal(
    (await call('admin-a', 'POST', path, { role: 'auditor' })).status,
    201,
    'what the caller holds, it may grant',
  );
  t.equal(
    (await call('root', 'POST', path, { capability: 'platform:config' })).status,
    201,
    'the platform admin holds it',
  );
  // Acting as the account is holding what it holds: no key, no ownership for a caller who does not.
  const key = await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/keys`, {});
  t.equal(key.status, 403, 'a key of an account holding platform:config');
  t.match(key.body.detail, /confers platform:config over org org-a, which you do not hold/);
  await call('root', 'PUT', '/orgs/org-a/members/admin-a', {});
  t.equal(
    (await call('admin-a', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/transfer`, { owner: 'admin-a' }))
      .status,
    403,
    'nor its ownership',
  );
  t.equal(
    (await call('root', 'POST', `/orgs/org-a/service-accounts/${created.body.id}/keys`, {})).status,
    201,
    'the platform admin may',
  );
});

t.test('a change whose audit record cannot be made durable leaves no client behind at the IdP', async (t) => {
  let stall = false;
  const sink: AuditSink = {
    append: () => (stall ? new Promise(() => {}) : Promise.resolve()),
    flush: async () => {},
    close: async () => {},
  };
  const strict = await h.start({ seedAdmin: ['root'], auditCaptureTimeout: 200 }, sink);
  t.teardown(() => strict.close());
  t.equal((await h.callAt(strict.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' })).status, 201);
  const before = h.issuer.registeredClients();
  stall = true;
  const refused = await h.callAt(strict.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'ghost' });
  t.equal(refused.status, 503);
  t.equal(h.issuer.registeredClients(), before, 'the registration was undone');
  stall = false;
  t.same((await h.callAt(strict.port, 'root', 'GET', '/orgs/org-a/service-accounts')).body, [], 'and nothing stored');
});

t.test('an undo the IdP refuses is kept, logged, counted, audited, and done at the next start', async (t) => {
  const pgDb = await freshPgDatabase('dvx_idp_undo');
  if (!pgDb) {
    if (process.env.CI) t.fail('no PostgreSQL at 127.0.0.1:5432');
    return;
  }
  t.teardown(() => pgDb.drop());
  // The store change after the registration is refused (its audit record never becomes durable), and
  // at that very moment the IdP stops answering: the undo (removing the client) fails for real.
  let stallNext = false;
  const records: Record<string, unknown>[] = [];
  const sink: AuditSink = {
    append: async (_table, record) => {
      if (stallNext) {
        stallNext = false;
        await h.issuer.pause();
        return new Promise(() => {});
      }
      records.push(record as Record<string, unknown>);
    },
    flush: async () => {},
    close: async () => {},
  };
  const first = await h.start({ seedAdmin: ['root'], auditCaptureTimeout: 300, databaseDsn: pgDb.dsn }, sink);
  let firstOpen = true;
  t.teardown(async () => {
    if (firstOpen) await first.close();
  });
  t.equal((await h.callAt(first.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' })).status, 201);
  const before = h.issuer.registeredClients();
  stallNext = true;
  const refused = await h.callAt(first.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'orphan' });
  t.equal(refused.status, 503, 'the change is refused');
  t.equal(h.issuer.registeredClients(), before + 1, 'and the client it registered is still at the IdP');

  const db = new pg.Client({ connectionString: pgDb.dsn });
  await db.connect();
  t.teardown(() => db.end());
  const pending = (await db.query('SELECT step, org_id, client_id, attempts, last_error, cause FROM idp_pending_undo'))
    .rows;
  t.equal(pending.length, 1, 'the undo is pending in the store');
  t.match(pending[0], {
    step: 'remove',
    org_id: 'org-a',
    client_id: /\S/,
    attempts: 1,
    last_error: /fetch failed|ECONNREFUSED/,
    cause: /audit record/,
  });
  const failures = (await first.registry.getSingleMetric('dvx_controlplane_idp_undo_failures_total')!.get()).values;
  t.same(
    failures.map((v) => [v.labels.step, v.value]),
    [['remove', 1]],
    'counted',
  );
  t.match(
    records.at(-1),
    {
      action: 'service-account.idp-undo',
      actor: 'root',
      org_id: 'org-a',
      outcome: 'deny',
      resource: `idp-client:${pending[0].client_id}`,
      reason: /IdP remove of client .* failed/,
    },
    'audited',
  );

  await first.close();
  firstOpen = false;
  await h.issuer.resume();
  const second = await h.start({ seedAdmin: ['root'], databaseDsn: pgDb.dsn });
  t.teardown(() => second.close());
  for (let i = 0; i < 100 && (await db.query('SELECT 1 FROM idp_pending_undo')).rows.length > 0; i++)
    await new Promise((r) => setTimeout(r, 50));
  t.same((await db.query('SELECT * FROM idp_pending_undo')).rows, [], 'the restarted control plane did the undo');
  t.equal(h.issuer.registeredClients(), before, 'the orphan client is gone from the IdP');
  t.ok(
    h.audit.some(
      (r) =>
        r.action === 'service-account.idp-undo' &&
        r.actor === 'controlplane' &&
        r.outcome === 'allow' &&
        r.resource === `idp-client:${pending[0].client_id}`,
    ),
    'and the retry is audited',
  );
  const retries = (await second.registry.getSingleMetric('dvx_controlplane_idp_undo_retries_total')!.get()).values;
  t.same(
    retries.map((v) => [v.labels.step, v.labels.outcome, v.value]),
    [['remove', 'done', 1]],
  );

  // A key removal whose store change fails while the IdP goes away: the IdP is left refusing a key
  // the store still holds until the next start puts the store's key set back.
  const atIdp = async (key: ServiceAccountKey) =>
    (
      await fetch(`${h.issuer.issuer}/token`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: await tokenRequestForm(key, { resource: AUDIENCE, scope: 'api' }),
      })
    ).status;
  const account = await h.callAt(second.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'keyed' });
  const k1 = parseServiceAccountKey(account.body.credential);
  const k2 = parseServiceAccountKey(
    (await h.callAt(second.port, 'root', 'POST', `/orgs/org-a/service-accounts/${account.body.id}/keys`)).body
      .credential,
  );
  const third = await h.start({ seedAdmin: ['root'], auditCaptureTimeout: 300, databaseDsn: pgDb.dsn }, sink);
  let thirdOpen = true;
  t.teardown(async () => {
    if (thirdOpen) await third.close();
  });
  stallNext = true;
  t.equal(
    (await h.callAt(third.port, 'root', 'DELETE', `/orgs/org-a/service-accounts/${account.body.id}/keys/${k1.key_id}`))
      .status,
    503,
  );
  t.match((await db.query('SELECT step, client_id, attempts FROM idp_pending_undo')).rows, [
    { step: 'update', client_id: account.body.id, attempts: 1 },
  ]);
  await third.close();
  thirdOpen = false;
  await h.issuer.resume();
  t.equal(await atIdp(k1), 401, 'the IdP refuses the key the store still holds');
  const fourth = await h.start({ seedAdmin: ['root'], databaseDsn: pgDb.dsn });
  t.teardown(() => fourth.close());
  for (let i = 0; i < 100 && (await db.query('SELECT 1 FROM idp_pending_undo')).rows.length > 0; i++)
    await new Promise((r) => setTimeout(r, 50));
  t.same((await db.query('SELECT * FROM idp_pending_undo')).rows, []);
  t.equal(await atIdp(k1), 200, "after the restart the IdP holds the store's keys again");
  t.equal(await atIdp(k2), 200);
});
