import t from 'tap';
import { startOperatorCli } from '../../fixtures/operator-cli.ts';

// dvx grant and dvx roles against a real control plane: platform and org grants, custom roles, the
// Problem paths and local validation.

const cli = await startOperatorCli(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'nobody', org: 'org-a' },
  ],
  ['root'],
);
t.teardown(() => cli.close());

t.test('roles: list, create, get, set, delete', async (t) => {
  const l = await cli.as('root', ['roles', 'list']);
  t.equal(l.code, 0, l.stderr);
  t.ok((JSON.parse(l.stdout) as { name: string }[]).some((r) => r.name === 'platform-admin'));
  const c = await cli.as('root', ['roles', 'create', 'readers', '--capability', 'audit:read']);
  t.equal(c.code, 0, c.stderr);
  t.match(JSON.parse(c.stdout), { name: 'readers', capabilities: ['audit:read'] });
  const s = await cli.as('root', [
    'roles',
    'set',
    'readers',
    '--capability',
    'audit:read',
    '--capability',
    'enclaves:read',
  ]);
  t.equal(s.code, 0, s.stderr);
  const g = await cli.as('root', ['roles', 'get', 'readers']);
  t.same(JSON.parse(g.stdout).capabilities.sort(), ['audit:read', 'enclaves:read']);
  const bad = await cli.as('root', ['roles', 'create', 'x-role', '--capability', 'fly:away']);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /unknown capability "fly:away"/);
  const refused = await cli.as('nobody', ['roles', 'create', 'mine', '--capability', 'audit:read']);
  t.equal(refused.code, 4);
  const none = await cli.as('root', ['roles', 'get', 'nope']);
  t.equal(none.code, 5);
});

t.test('grant: platform and org grants, create, list, delete', async (t) => {
  t.equal((await cli.as('root', ['orgs', 'create', 'acme'])).code, 0);
  t.equal((await cli.as('root', ['groups', 'create', 'eng', '--org', 'acme'])).code, 0);
  const p = await cli.as('root', ['grant', 'create', 'user:carol', '--role', 'readers']);
  t.equal(p.code, 0, p.stderr);
  const platform = JSON.parse(p.stdout);
  t.match(platform, { principal: 'user:carol', role: 'readers', scope_kind: 'platform' });
  const o = await cli.as('root', [
    'grant',
    'create',
    'user:dave',
    '--org',
    'acme',
    '--capability',
    'audit:read',
    '--group',
    'eng',
  ]);
  t.equal(o.code, 0, o.stderr);
  const org = JSON.parse(o.stdout);
  t.match(org, { principal: 'user:dave', capability: 'audit:read', scope_kind: 'group', group_id: 'eng' });
  const lo = await cli.as('root', ['grant', 'list', '--org', 'acme']);
  t.ok((JSON.parse(lo.stdout) as { id: number }[]).some((g) => g.id === org.id));
  const lp = await cli.as('root', ['grant', 'list', '--output', 'jsonl']);
  t.ok(
    lp.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .some((g: { id: number }) => g.id === platform.id),
  );
  const d = await cli.as('root', ['grant', 'delete', String(org.id), '--org', 'acme']);
  t.equal(d.code, 0, d.stderr);
  t.equal(d.stdout, '');
  const again = await cli.as('root', ['grant', 'delete', String(org.id), '--org', 'acme']);
  t.equal(again.code, 5);
  t.match(again.stderr, /^dvx: 404 /);
  t.equal((await cli.as('root', ['grant', 'delete', String(platform.id)])).code, 0);
});

t.test('grant: refusals and local validation', async (t) => {
  const refused = await cli.as('nobody', ['grant', 'create', 'user:nobody', '--role', 'platform-admin']);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
  const principal = await cli.as('root', ['grant', 'create', 'carol', '--role', 'readers']);
  t.equal(principal.code, 2);
  t.match(principal.stderr, /principal "carol" is not valid/);
  const both = await cli.as('root', ['grant', 'create', 'user:x', '--role', 'readers', '--capability', 'audit:read']);
  t.equal(both.code, 2);
  const narrow = await cli.as('root', ['grant', 'create', 'user:x', '--role', 'readers', '--group', 'eng']);
  t.equal(narrow.code, 2);
  t.match(narrow.stderr, /give --org/);
  const id = await cli.as('root', ['grant', 'delete', '../1']);
  t.equal(id.code, 2);
  const local = await cli.as('root', ['grant', 'list', '--local']);
  t.equal(local.code, 2, 'the broker is needed for --local');
  t.match(local.stderr, /--broker is required/);
  const l = await cli.as('root', ['grant', 'list']);
  t.notOk(
    (JSON.parse(l.stdout) as { principal: string }[]).some((g) => g.principal === 'user:x'),
    'nothing sent',
  );
});
