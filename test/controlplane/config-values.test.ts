import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// POST/DELETE /api/v1/config/{key} at platform, org, group and agent scope: every status of the
// spec's table (200/204/400/401/403/404/409), locks, and secret declarations.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'cfg-a', org: 'org-a', human: true },
    { clientId: 'plain', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await h.call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:cfg-a', capability: 'platform:config' });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', group: 'ops' });

t.test('200 at every scope, read back, 204 on delete', async (t) => {
  t.same((await h.call('root', 'POST', '/config/log.level', { value: 'info' })).body, {
    key: 'log.level',
    scope: 'platform',
    locked: false,
    published: false,
  });
  t.same((await h.call('cfg-a', 'POST', '/config/log.level?scope=org&org=org-a', { value: 'debug' })).body, {
    key: 'log.level',
    scope: 'org:org-a',
    locked: false,
    published: false,
  });
  t.same(
    (await h.call('cfg-a', 'POST', '/config/limits?scope=group&org=org-a&group=ops', { value: { rps: 5 } })).body,
    { key: 'limits', scope: 'group:org-a:ops', locked: false, published: false },
  );
  t.same((await h.call('cfg-a', 'POST', '/config/limits?scope=agent&agent=bot-1', { value: { rps: 1 } })).body, {
    key: 'limits',
    scope: 'agent:bot-1',
    locked: false,
    published: false,
  });
  t.same((await h.call('cfg-a', 'GET', '/config?scope=group&org=org-a&group=ops')).body, [
    { key: 'limits', scope: 'group:org-a:ops', value: { rps: 5 }, locked: false, secret: false },
  ]);
  t.equal((await h.call('cfg-a', 'DELETE', '/config/limits?scope=agent&agent=bot-1')).status, 204);
  t.equal(
    (await h.call('cfg-a', 'DELETE', '/config/limits?scope=agent&agent=bot-1')).status,
    404,
    'not set there any more',
  );
  t.ok(h.audit.some((r) => r.action === 'config.put' && r.resource === 'config:org:org-a:log.level'));
});

t.test('401 and 403', async (t) => {
  t.equal((await h.anonymous('POST', '/config/x', { value: 1 })).status, 401);
  t.equal((await h.anonymous('DELETE', '/config/x')).status, 401);
  t.equal(
    (await h.call('cfg-a', 'POST', '/config/x', { value: 1 })).status,
    403,
    'platform scope needs a platform grant',
  );
  t.equal((await h.call('plain', 'POST', '/config/x?scope=org&org=org-a', { value: 1 })).status, 403);
  t.equal((await h.call('plain', 'DELETE', '/config/log.level?scope=org&org=org-a')).status, 403);
});

t.test('400: malformed body, key or scope; a secret with a value; locked at agent scope', async (t) => {
  const cases: [string, unknown, RegExp][] = [
    ['/config/x?scope=org&org=org-a', {}, /^value: is required/],
    ['/config/x?scope=org&org=org-a', { value: 1, secret: true }, /^value: must be absent when secret is true/],
    ['/config/x?scope=org&org=org-a', { value: 1, locked: 'yes' }, /^locked: must be a boolean/],
    ['/config/x?scope=org&org=org-a', { value: 1, colour: 'red' }, /^colour: unknown field/],
    ['/config/x?scope=org&org=org-a', [1], /^body: must be a JSON object/],
    ['/config/x?scope=agent&agent=bot-1', { value: 1, locked: true }, /^locked: is refused at agent scope/],
    ['/config/x?scope=galaxy', { value: 1 }, /^scope: must be platform, org, group or agent/],
    ['/config/x?scope=org', { value: 1 }, /^org: is required/],
    ['/config/x?scope=group&org=org-a', { value: 1 }, /^group: is required/],
    ['/config/x?scope=platform&org=org-a', { value: 1 }, /^scope: platform scope takes no org/],
    ['/config/x?flavour=1', { value: 1 }, /^flavour: unknown query parameter/],
    ['/config/bad%20key?scope=org&org=org-a', { value: 1 }, /^key: must be/],
  ];
  for (const [path, body, detail] of cases) {
    const r = await h.call('root', 'POST', path, body);
    t.equal(r.status, 400, `${path} ${JSON.stringify(body)}`);
    t.match(r.body, { type: 'https://dvx.dev/problems/bad-request', detail }, path);
  }
});

t.test('404: unknown org, group or agent; 409: a lock above, a secret declared', async (t) => {
  t.equal((await h.call('root', 'POST', '/config/x?scope=org&org=org-zz', { value: 1 })).status, 404);
  t.equal((await h.call('root', 'POST', '/config/x?scope=group&org=org-a&group=nope', { value: 1 })).status, 404);
  t.equal((await h.call('root', 'POST', '/config/x?scope=agent&agent=ghost', { value: 1 })).status, 404);
  t.equal((await h.call('root', 'DELETE', '/config/never-set?scope=org&org=org-a')).status, 404);

  t.equal((await h.call('root', 'POST', '/config/region', { value: 'eu', locked: true })).status, 200);
  const below = await h.call('cfg-a', 'POST', '/config/region?scope=org&org=org-a', { value: 'us' });
  t.equal(below.status, 409);
  t.match(below.body.detail, /region is locked at platform/);
  t.equal(
    (await h.call('cfg-a', 'DELETE', '/config/region?scope=org&org=org-a')).status,
    409,
    'no change below a lock',
  );
  t.equal(
    (await h.call('cfg-a', 'POST', '/config/mode?scope=org&org=org-a', { value: 'strict', locked: true })).status,
    200,
  );
  t.equal(
    (await h.call('cfg-a', 'POST', '/config/mode?scope=group&org=org-a&group=ops', { value: 'lax' })).status,
    409,
  );
  t.equal((await h.call('cfg-a', 'POST', '/config/mode?scope=agent&agent=bot-1', { value: 'lax' })).status, 409);

  const secret = await h.call('cfg-a', 'POST', '/config/api.token?scope=org&org=org-a', { secret: true });
  t.same(secret.body, { key: 'api.token', scope: 'org:org-a', locked: false, published: false });
  t.same(
    (await h.call('cfg-a', 'GET', '/config?scope=org&org=org-a')).body.find(
      (r: { key: string }) => r.key === 'api.token',
    ),
    { key: 'api.token', scope: 'org:org-a', value: null, locked: false, secret: true },
  );
  const leak = await h.call('cfg-a', 'POST', '/config/api.token?scope=agent&agent=bot-1', { value: 'sk-live-123' });
  t.equal(leak.status, 409, 'no value for a key declared secret above');
  t.match(leak.body.detail, /declared secret at org:org-a/);
  t.notOk(JSON.stringify(h.audit).includes('sk-live-123'));
});
