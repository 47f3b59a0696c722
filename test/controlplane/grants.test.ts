import t from 'tap';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Grants through the API, by persona: the platform admin (seeded), an org admin it appoints, a caller
// with nothing; bad bodies; duplicates; deletion; every change audited before it commits.

const h = await startCpHarness(
  [
    { clientId: 'platform-admin', org: 'org-1' },
    { clientId: 'org1-admin', org: 'org-1' },
    { clientId: 'nobody', org: 'org-1' },
    { clientId: 'cfg-admin', org: 'org-1' },
  ],
  { seedAdmin: ['platform-admin'] },
);
t.teardown(() => h.close());
const { call, audit } = h;

t.test('the platform admin appoints an org admin; the org admin manages its org only', async (t) => {
  const appointed = await call('platform-admin', 'POST', '/orgs/org-1/grants', {
    principal: 'user:org1-admin',
    role: 'org-admin',
  });
  t.equal(appointed.status, 201);
  t.match(appointed.body, {
    principal: 'user:org1-admin',
    role: 'org-admin',
    capability: null,
    scope_kind: 'org',
    org_id: 'org-1',
    group_id: '',
    agent_id: '',
  });
  t.type(appointed.body.id, 'number', 'id is an int64');
  t.match(audit.at(-1), {
    stream: 'audit',
    table: 'audit_events',
    action: 'grant.create',
    actor: 'platform-admin',
    actor_kind: 'service',
    org_id: 'org-1',
    outcome: 'allow',
    resource: `grant:${appointed.body.id}`,
  });

  const who = await call('org1-admin', 'GET', '/whoami');
  t.same(who.body.capabilities, [
    'agents:manage',
    'audit:read',
    'audit:read:all',
    'clients:manage',
    'enclaves:read',
    'members:*',
    'org:manage',
  ]);

  const auditor = await call('org1-admin', 'POST', '/orgs/org-1/grants', { principal: 'agent:a-7', role: 'auditor' });
  t.equal(auditor.status, 201, 'an org admin grants an agent the auditor role');
  const narrowed = await call('org1-admin', 'POST', '/orgs/org-1/grants', {
    principal: 'user:bob',
    capability: 'agents:manage',
    group: 'builders',
  });
  t.match(narrowed.body, { scope_kind: 'group', group_id: 'builders', capability: 'agents:manage' });
  const list = await call('org1-admin', 'GET', '/orgs/org-1/grants');
  t.same(
    list.body.map((g: { principal: string }) => g.principal),
    ['user:org1-admin', 'agent:a-7', 'user:bob'],
  );

  t.equal((await call('org1-admin', 'GET', '/orgs/org-2/grants')).status, 403, 'another org');
  t.equal(
    (await call('org1-admin', 'POST', '/grants', { principal: 'user:x', role: 'member' })).status,
    403,
    'platform grants need platform:config',
  );
  const forbidden = await call('nobody', 'GET', '/orgs/org-1/grants');
  t.equal(forbidden.status, 403);
  t.match(forbidden.body, { type: 'https://dvx.dev/problems/forbidden', detail: /members:\* over org org-1/ });
  t.equal(forbidden.type, 'application/problem+json; charset=utf-8');
});

t.test('a grant confers only what its grantor holds over that scope', async (t) => {
  await call('platform-admin', 'POST', '/orgs', { id: 'org-1', name: 'One' });
  const before = (await call('platform-admin', 'GET', '/orgs/org-1/grants')).body.length;
  const refused = async (who: string, path: string, body: unknown, capability: string) => {
    const r = await call(who, 'POST', path, body);
    t.equal(r.status, 403, `${who} ${path} ${JSON.stringify(body)}`);
    t.match(r.body, {
      type: 'https://dvx.dev/problems/forbidden',
      detail: new RegExp(`confers ${capability} over .*which you do not hold`),
    });
  };
  // The org admin, to itself included: neither platform capability, not even narrowed to its org.
  await refused(
    'org1-admin',
    '/orgs/org-1/grants',
    { principal: 'user:org1-admin', capability: 'platform:config' },
    'platform:config',
  );
  await refused(
    'org1-admin',
    '/orgs/org-1/grants',
    { principal: 'user:org1-admin', capability: 'platform:audit:read' },
    'platform:audit:read',
  );
  await refused(
    'org1-admin',
    '/orgs/org-1/grants',
    { principal: 'user:bob', capability: 'platform:config', group: 'builders' },
    'platform:config',
  );
  // Nor through a custom role carrying one.
  t.equal(
    (
      await call('platform-admin', 'POST', '/roles', {
        name: 'policy-writer',
        capabilities: ['platform:config', 'agents:manage'],
      })
    ).status,
    201,
  );
  await refused(
    'org1-admin',
    '/orgs/org-1/grants',
    { principal: 'user:org1-admin', role: 'policy-writer' },
    'platform:config',
  );
  t.equal((await call('platform-admin', 'GET', '/orgs/org-1/grants')).body.length, before, 'nothing was stored');
  t.equal(
    (await call('org1-admin', 'PUT', '/policies/exec?scope=org&org=org-1', { enabled: true })).status,
    403,
    'and governance policy stays out of reach',
  );
  // What it holds, it may pass on.
  t.equal(
    (await call('org1-admin', 'POST', '/orgs/org-1/grants', { principal: 'user:bob', role: 'auditor' })).status,
    201,
  );

  // A group membership confers the group's grants.
  t.equal((await call('platform-admin', 'POST', '/orgs/org-1/groups', { id: 'ops', name: 'Ops' })).status, 201);
  t.equal(
    (
      await call('platform-admin', 'POST', '/orgs/org-1/grants', {
        principal: 'group:org-1:ops',
        capability: 'platform:config',
      })
    ).status,
    201,
  );
  t.equal((await call('org1-admin', 'PUT', '/orgs/org-1/members/org1-admin', {})).status, 200);
  const join = await call('org1-admin', 'PUT', '/orgs/org-1/groups/ops/members/org1-admin');
  t.equal(join.status, 403, 'joining a group that holds platform:config');
  t.match(join.body.detail, /membership of group ops confers platform:config over org org-1/);
  t.equal(
    (await call('platform-admin', 'PUT', '/orgs/org-1/groups/ops/members/org1-admin')).status,
    204,
    'the platform admin holds it',
  );

  // Platform scope and role definitions: a holder of platform:config alone passes on nothing else.
  t.equal(
    (await call('platform-admin', 'POST', '/grants', { principal: 'user:cfg-admin', capability: 'platform:config' }))
      .status,
    201,
  );
  await refused(
    'cfg-admin',
    '/grants',
    { principal: 'user:cfg-admin', capability: 'platform:audit:read' },
    'platform:audit:read',
  );
  await refused('cfg-admin', '/grants', { principal: 'user:cfg-admin', role: 'platform-admin' }, 'enclaves:read');
  await refused(
    'cfg-admin',
    '/roles',
    { name: 'reader', capabilities: ['platform:audit:read'] },
    'platform:audit:read',
  );
  const put = await call('cfg-admin', 'PUT', '/roles/policy-writer', {
    capabilities: ['platform:config', 'platform:audit:read'],
  });
  t.equal(put.status, 403, 'nor widen a role it may edit');
  t.equal(
    (await call('cfg-admin', 'POST', '/roles', { name: 'cfg-only', capabilities: ['platform:config'] })).status,
    201,
    'what it holds it may',
  );
  t.same((await call('cfg-admin', 'GET', '/whoami')).body.capabilities, ['platform:config']);
  for (const role of ['cfg-only', 'policy-writer'])
    t.equal((await call('platform-admin', 'DELETE', `/roles/${role}`)).status, 204);
});

t.test('bad bodies are 400 problems naming the field; nothing is stored', async (t) => {
  const before = (await call('platform-admin', 'GET', '/orgs/org-1/grants')).body.length;
  const cases: [unknown, RegExp][] = [
    [[], /body: must be a JSON object/],
    [{ role: 'member' }, /principal: is required/],
    [{ principal: 'bob', role: 'member' }, /principal: must be user:<subject>/],
    [{ principal: 'user:bob' }, /role: exactly one of role and capability/],
    [{ principal: 'user:bob', role: 'member', capability: 'audit:read' }, /exactly one/],
    [{ principal: 'user:bob', role: 'wizard' }, /role: unknown role "wizard"/],
    [{ principal: 'user:bob', capability: 'fly' }, /capability: unknown capability/],
    [
      { principal: 'user:bob', role: 'member', group: 'g', agent: 'a' },
      /agent: a grant is narrowed to a group or an agent, not both/,
    ],
    [
      { principal: 'agent:a-1', role: 'org-admin' },
      /principal: an agent principal may only be granted the auditor role/,
    ],
    [{ principal: 'group:org-2:ops', role: 'member' }, /group principals of org org-1 only/],
    [{ principal: 'user:bob', role: 'platform-admin' }, /platform-admin is granted at platform scope/],
    [{ principal: 'user:bob', role: 'member', colour: 'red' }, /colour: unknown field/],
  ];
  for (const [body, detail] of cases) {
    const r = await call('platform-admin', 'POST', '/orgs/org-1/grants', body);
    t.equal(r.status, 400, JSON.stringify(body));
    t.match(r.body, { type: 'https://dvx.dev/problems/bad-request', detail });
  }
  t.equal((await call('platform-admin', 'GET', '/orgs/org-1/grants')).body.length, before);
});

t.test('duplicates conflict; deletion is scoped to the path', async (t) => {
  const first = await call('platform-admin', 'POST', '/grants', { principal: 'user:carol', role: 'member' });
  t.equal(first.status, 201);
  t.equal(first.body.scope_kind, 'platform');
  const again = await call('platform-admin', 'POST', '/grants', { principal: 'user:carol', role: 'member' });
  t.equal(again.status, 409);
  t.match(again.body, { type: 'https://dvx.dev/problems/conflict' });
  t.equal(
    (await call('platform-admin', 'DELETE', `/orgs/org-1/grants/${first.body.id}`)).status,
    404,
    'a platform grant is not under an org path',
  );
  t.equal((await call('platform-admin', 'DELETE', `/grants/${first.body.id}`)).status, 204);
  t.equal((await call('platform-admin', 'DELETE', `/grants/${first.body.id}`)).status, 404, 'gone');
  t.match(audit.at(-1), { action: 'grant.delete', resource: `grant:${first.body.id}` });
});

t.test('capture-or-deny: a change whose audit record cannot be made durable is refused and not applied', async (t) => {
  const stalled: AuditSink = { append: () => new Promise(() => {}), flush: async () => {}, close: async () => {} };
  const other = await h.start({ auditCaptureTimeout: 200, seedAdmin: ['platform-admin'] }, stalled);
  t.teardown(() => other.close());
  const post = await h.callAt(other.port, 'platform-admin', 'POST', '/grants', {
    principal: 'user:dave',
    role: 'member',
  });
  t.equal(post.status, 503);
  t.match(post.body, { type: 'https://dvx.dev/problems/audit-unavailable' });
  const list = await h.callAt(other.port, 'platform-admin', 'GET', '/grants');
  t.same(
    list.body.map((g: { principal: string }) => g.principal),
    ['user:platform-admin'],
    'the grant was rolled back',
  );
});

t.test('custom roles: create, grant, change, refuse to delete while granted, delete', async (t) => {
  const created = await call('platform-admin', 'POST', '/roles', {
    name: 'agent-ops',
    capabilities: ['agents:manage', 'enclaves:read'],
  });
  t.equal(created.status, 201);
  t.same(created.body, { name: 'agent-ops', capabilities: ['agents:manage', 'enclaves:read'] });
  t.equal((await call('platform-admin', 'POST', '/roles', { name: 'agent-ops', capabilities: [] })).status, 409);
  t.equal(
    (await call('platform-admin', 'POST', '/roles', { name: 'auditor', capabilities: [] })).status,
    409,
    'built-in',
  );
  t.match((await call('platform-admin', 'POST', '/roles', { name: 'x', capabilities: ['fly'] })).body, {
    detail: /^name: /,
  });
  t.match((await call('platform-admin', 'POST', '/roles', { name: 'ok-name', capabilities: ['fly'] })).body, {
    detail: /^capabilities\[0\]: unknown capability/,
  });
  const grant = await call('platform-admin', 'POST', '/orgs/org-1/grants', {
    principal: 'user:nobody',
    role: 'agent-ops',
  });
  t.equal(grant.status, 201);
  t.same(
    (await call('nobody', 'GET', '/whoami')).body.capabilities,
    ['agents:manage', 'enclaves:read'],
    'the custom role takes effect',
  );
  t.equal((await call('platform-admin', 'PUT', '/roles/agent-ops', { capabilities: ['audit:read'] })).status, 200);
  t.same((await call('nobody', 'GET', '/whoami')).body.capabilities, ['audit:read'], 'and its change too');
  t.equal((await call('platform-admin', 'DELETE', '/roles/agent-ops')).status, 409, 'still granted');
  t.equal((await call('platform-admin', 'DELETE', `/orgs/org-1/grants/${grant.body.id}`)).status, 204);
  t.equal((await call('platform-admin', 'DELETE', '/roles/agent-ops')).status, 204);
  t.equal((await call('platform-admin', 'PUT', '/roles/agent-ops', { capabilities: [] })).status, 404);
  const listed = await call('platform-admin', 'GET', '/roles');
  t.same(
    listed.body.map((r: { name: string }) => r.name),
    ['platform-admin', 'org-admin', 'member', 'auditor'],
  );
  t.equal((await call('org1-admin', 'GET', '/roles')).status, 403);
  t.match(audit.at(-1), { action: 'role.delete', resource: 'role:agent-ops' });
});
