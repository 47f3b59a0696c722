import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Members, group memberships feeding effective capabilities, and offboarding.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'alice', org: 'org-a' },
    { clientId: 'mallory', org: 'org-a' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());

t.test('a member added to a group holds what the group was granted; offboarding takes it all', async (t) => {
  t.equal((await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' })).status, 201);
  t.equal((await h.call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' })).status, 201);
  t.equal(
    (await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'group:org-a:ops', role: 'org-admin' })).status,
    201,
  );
  const put = await h.call('root', 'PUT', '/orgs/org-a/members/alice', {
    username: 'alice',
    email: 'alice@example.com',
  });
  t.same(put.body, { subject: 'alice', username: 'alice', email: 'alice@example.com' });
  t.equal((await h.call('root', 'PUT', '/orgs/org-a/groups/ops/members/alice')).status, 204);
  const who = (await h.call('alice', 'GET', '/whoami')).body;
  t.same(who.groups, ['ops']);
  t.ok(who.capabilities.includes('members:*'), 'the group grant reached her');
  const effective = await h.call('alice', 'GET', '/orgs/org-a/members/alice/effective');
  t.same(effective.body, { subject: 'alice', org_id: 'org-a', groups: ['ops'], capabilities: who.capabilities });
  t.same((await h.call('alice', 'GET', '/orgs/org-a/members')).body, [
    { subject: 'alice', username: 'alice', email: 'alice@example.com' },
  ]);
  t.equal(
    (await h.call('mallory', 'GET', '/orgs/org-a/members/alice/effective')).status,
    403,
    'not about others without members:*',
  );
  t.equal((await h.call('mallory', 'GET', '/orgs/org-a/members/mallory/effective')).status, 200, 'about themself');

  t.equal(
    (await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:alice', capability: 'audit:read:all' }))
      .status,
    201,
  );
  const off = await h.call('root', 'POST', '/orgs/org-a/members/alice/offboard');
  t.same(off.body, { subject: 'alice' });
  const after = (await h.call('alice', 'GET', '/whoami')).body;
  t.same([after.groups, after.capabilities], [[], []], 'no group, no grant left');
  t.equal((await h.call('root', 'POST', '/orgs/org-a/members/alice/offboard')).status, 404);
  t.same(
    h.audit.slice(-1).map((r) => r.action),
    ['member.offboard'],
  );
});

t.test('bad input', async (t) => {
  t.match((await h.call('root', 'PUT', '/orgs/org-a/members/bob', { email: 'not-an-email' })).body, {
    status: 400,
    detail: /^email: is not an email/,
  });
  t.match((await h.call('root', 'PUT', '/orgs/org-a/members/bob', { role: 'x' })).body, {
    status: 400,
    detail: /^role: unknown field/,
  });
  t.equal((await h.call('root', 'PUT', '/orgs/org-a/groups/ops/members/stranger')).status, 404, 'members first');
  t.equal((await h.call('root', 'PUT', '/orgs/org-a/groups/nope/members/alice')).status, 404);
  t.equal((await h.call('root', 'GET', '/orgs/org-zz/members')).status, 404);
  t.equal((await h.call('root', 'DELETE', '/orgs/org-a/groups/ops/members/alice')).status, 404);
});
