import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Orgs and groups by persona, with bad input and cascading deletes.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'a-admin', org: 'org-a' },
    { clientId: 'b-admin', org: 'org-b' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());

t.test('the platform admin creates orgs; org admins manage their own org and its groups', async (t) => {
  const a = await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'Org A', provider_org_ref: 'zitadel:123' });
  t.equal(a.status, 201);
  t.same(a.body, { id: 'org-a', kind: 'customer', name: 'Org A', provider_org_ref: 'zitadel:123', status: 'active' });
  t.equal((await h.call('root', 'POST', '/orgs', { id: 'org-b', name: 'Org B' })).status, 201);
  t.equal((await h.call('root', 'POST', '/orgs', { id: 'org-b', name: 'Again' })).status, 409);
  t.same(
    (await h.call('root', 'GET', '/orgs')).body.map((o: { id: string }) => o.id),
    ['org-a', 'org-b'],
  );
  await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:a-admin', role: 'org-admin' });
  await h.call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:b-admin', role: 'org-admin' });

  t.match((await h.call('a-admin', 'GET', '/orgs/org-a')).body, { id: 'org-a', name: 'Org A' });
  t.equal((await h.call('a-admin', 'GET', '/orgs/org-b')).status, 403);
  t.equal((await h.call('a-admin', 'GET', '/orgs')).status, 403, 'listing every org is platform administration');
  t.match((await h.call('a-admin', 'PUT', '/orgs/org-a', { name: 'Org A2', status: 'suspended' })).body, {
    name: 'Org A2',
    status: 'suspended',
    provider_org_ref: 'zitadel:123',
  });
  const g = await h.call('a-admin', 'POST', '/orgs/org-a/groups', {
    id: 'builders',
    name: 'Builders',
    provider_group_ref: 'grp-9',
  });
  t.equal(g.status, 201);
  t.same(g.body, { id: 'builders', name: 'Builders', org_id: 'org-a', provider_group_ref: 'grp-9' });
  t.equal((await h.call('b-admin', 'POST', '/orgs/org-a/groups', { id: 'x', name: 'X' })).status, 403);
  t.same(
    (await h.call('a-admin', 'GET', '/orgs/org-a/groups')).body.map((x: { id: string }) => x.id),
    ['builders'],
  );
  t.same(
    h.audit.map((r) => r.action),
    ['org.create', 'org.create', 'grant.create', 'grant.create', 'org.update', 'group.create'],
    'every change audited once; the refused duplicate not at all',
  );
});

t.test('bad input and unknown resources', async (t) => {
  const cases: [string, string, unknown, number, RegExp][] = [
    ['POST', '/orgs', { name: 'no id' }, 400, /^id: is required/],
    ['POST', '/orgs', { id: 'Bad Id', name: 'x' }, 400, /^id: must be/],
    ['POST', '/orgs', { id: 'org-c', name: '' }, 400, /^name: must not be empty/],
    ['POST', '/orgs', { id: 'org-c', name: 'C', status: 'frozen' }, 400, /^status: must be one of active, suspended/],
    ['POST', '/orgs', { id: 'org-c', name: 'C', owner: 'me' }, 400, /^owner: unknown field/],
    ['PUT', '/orgs/org-a', { status: 'gone' }, 400, /^status:/],
    ['GET', '/orgs/org-zz', undefined, 404, /no org org-zz/],
    ['POST', '/orgs/org-zz/groups', { id: 'g', name: 'G' }, 404, /no org org-zz/],
    ['DELETE', '/orgs/org-a/groups/nope', undefined, 404, /no group nope/],
  ];
  for (const [method, path, body, status, detail] of cases) {
    const r = await h.call('root', method, path, body);
    t.equal(r.status, status, `${method} ${path} ${JSON.stringify(body)}`);
    t.match(r.body, { detail });
  }
});

t.test('deleting a group or an org removes what hangs off it', async (t) => {
  await h.call('a-admin', 'POST', '/orgs/org-a/grants', { principal: 'group:org-a:builders', role: 'member' });
  await h.call('a-admin', 'POST', '/orgs/org-a/grants', {
    principal: 'user:bob',
    capability: 'agents:manage',
    group: 'builders',
  });
  t.equal((await h.call('a-admin', 'DELETE', '/orgs/org-a/groups/builders')).status, 204);
  const left = (await h.call('a-admin', 'GET', '/orgs/org-a/grants')).body.map(
    (g: { principal: string }) => g.principal,
  );
  t.same(left, ['user:a-admin'], 'grants to and within the group are gone');
  t.equal((await h.call('a-admin', 'DELETE', '/orgs/org-b')).status, 403, 'deleting an org is platform administration');
  t.equal((await h.call('root', 'DELETE', '/orgs/org-b')).status, 204);
  t.equal((await h.call('b-admin', 'GET', '/whoami')).body.capabilities.length, 0, 'its grants went with it');
  t.equal((await h.call('root', 'DELETE', '/orgs/org-b')).status, 404);
});
