import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Role, capability and policy-kind names are the caller's strings: an Object.prototype member's name
// (`constructor`, `toString`, `__proto__`, …) is a name like any other, never a lookup that reaches the
// prototype. Once a grant of role `constructor` was a 500 on every grant route, and `PUT
// /roles/constructor` a 409 "built-in role".

const PROTO = [
  'constructor',
  'toString',
  '__proto__',
  'hasOwnProperty',
  'valueOf',
  'isPrototypeOf',
  '__defineGetter__',
];

const h = await startCpHarness(
  [
    { clientId: 'platform-admin', org: 'org-1' },
    { clientId: 'bob', org: 'org-1' },
  ],
  { seedAdmin: ['platform-admin'] },
);
t.teardown(() => h.close());
const { call } = h;
const problem = (status: number, detail: RegExp) => ({ status, body: { status, detail } });

t.test('every route that takes a role or a capability answers a prototype name as unknown', async (t) => {
  t.equal((await call('platform-admin', 'POST', '/orgs', { id: 'org-1', name: 'One' })).status, 201);
  const sa = await call('platform-admin', 'POST', '/orgs/org-1/service-accounts', { name: 'sa1' });
  t.equal(sa.status, 201);
  const grantRoutes = ['/orgs/org-1/grants', '/grants', `/orgs/org-1/service-accounts/${sa.body.id}/grants`];
  for (const name of PROTO) {
    for (const path of grantRoutes) {
      const principal = path.includes('service-accounts') ? {} : { principal: 'user:bob' };
      t.match(
        await call('platform-admin', 'POST', path, { ...principal, role: name }),
        problem(400, /role: unknown role/),
        `${path} role ${name}`,
      );
      t.match(
        await call('platform-admin', 'POST', path, { ...principal, capability: name }),
        problem(400, /capability: unknown capability/),
        `${path} capability ${name}`,
      );
    }
    t.match(
      await call('platform-admin', 'POST', '/orgs/org-1/service-accounts/self-service', {
        name: 'x',
        grants: [{ capability: name }],
      }),
      { status: 400 },
      `self-service grant capability ${name}`,
    );
    t.match(
      await call('platform-admin', 'POST', '/roles', { name: 'r-x', capabilities: [name] }),
      problem(400, /capabilit/),
      `role with capability ${name}`,
    );
    t.match(
      await call('platform-admin', 'PUT', `/roles/${name}`, { capabilities: ['enclaves:read'] }),
      problem(404, /no role/),
      `PUT /roles/${name}`,
    );
    t.match(await call('platform-admin', 'DELETE', `/roles/${name}`), problem(404, /no role/), `DELETE /roles/${name}`);
    for (const method of ['GET', 'PUT', 'DELETE']) {
      t.match(
        await call('platform-admin', method, `/policies/${name}`, method === 'PUT' ? { enabled: true } : undefined),
        problem(404, /no policy kind/),
        `${method} /policies/${name}`,
      );
    }
  }
  t.same(
    (await call('platform-admin', 'GET', '/orgs/org-1/grants')).body.filter(
      (g: { principal: string }) => g.principal === 'user:bob',
    ),
    [],
    'nothing was stored',
  );
});

t.test('a custom role named like a prototype member is a role like any other', async (t) => {
  const created = await call('platform-admin', 'POST', '/roles', {
    name: 'constructor',
    capabilities: ['enclaves:read', 'audit:read'],
  });
  t.equal(created.status, 201, 'not taken for a built-in role');
  const grant = await call('platform-admin', 'POST', '/orgs/org-1/grants', {
    principal: 'user:bob',
    role: 'constructor',
  });
  t.equal(grant.status, 201);
  t.same(
    (await call('bob', 'GET', '/whoami')).body.capabilities,
    ['audit:read', 'enclaves:read'],
    'its capabilities are the stored ones',
  );
  t.match(await call('platform-admin', 'PUT', '/roles/constructor', { capabilities: ['enclaves:read'] }), {
    status: 200,
  });
  t.same((await call('bob', 'GET', '/whoami')).body.capabilities, ['enclaves:read']);
  t.equal((await call('platform-admin', 'DELETE', `/orgs/org-1/grants/${grant.body.id}`)).status, 204);
  t.equal((await call('platform-admin', 'DELETE', '/roles/constructor')).status, 204);
});
