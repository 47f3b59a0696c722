import t from 'tap';
import { startOperatorCli } from '../../fixtures/operator-cli.ts';

// dvx orgs, dvx groups and dvx members against a real control plane: every command's happy path,
// a refusal (403 → exit 4) and a missing org (404 → exit 5) as one line, local validation (exit 2,
// nothing sent).

const cli = await startOperatorCli(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'nobody', org: 'org-a' },
  ],
  ['root'],
);
t.teardown(() => cli.close());

t.test('orgs: create, list, get, set, delete', async (t) => {
  const c = await cli.as('root', ['orgs', 'create', 'acme', '--name', 'Acme Inc']);
  t.equal(c.code, 0, c.stderr);
  t.match(JSON.parse(c.stdout), { id: 'acme', name: 'Acme Inc', status: 'active' });
  const l = await cli.as('root', ['orgs', 'list']);
  t.equal(l.code, 0, l.stderr);
  t.ok((JSON.parse(l.stdout) as { id: string }[]).some((o) => o.id === 'acme'));
  const table = await cli.as('root', ['orgs', 'list', '--output', 'table']);
  t.match(table.stdout, /^ID\s+NAME\s+STATUS\s+PROVIDER_ORG_REF\n/);
  const s = await cli.as('root', ['orgs', 'set', 'acme', '--status', 'suspended']);
  t.equal(s.code, 0, s.stderr);
  t.match(JSON.parse(s.stdout), { id: 'acme', status: 'suspended' });
  const g = await cli.as('root', ['orgs', 'get', 'acme']);
  t.match(JSON.parse(g.stdout), { id: 'acme', name: 'Acme Inc', status: 'suspended' });
  const fromFile = await cli.as('root', ['orgs', 'create', '--file', '-'], {
    stdin: JSON.stringify({ id: 'beta', name: 'Beta' }),
  });
  t.equal(fromFile.code, 0, fromFile.stderr);
  const d = await cli.as('root', ['orgs', 'delete', 'beta']);
  t.equal(d.code, 0, d.stderr);
  t.equal(d.stdout, '', 'a delete prints nothing on stdout');
  t.match(d.stderr, /org beta deleted/);
  const gone = await cli.as('root', ['orgs', 'get', 'beta']);
  t.equal(gone.code, 5);
  t.match(gone.stderr, /^dvx: 404 .*no org beta\n$/);
});

t.test('orgs: a caller without platform:config is refused, exit 4, one line', async (t) => {
  const r = await cli.as('nobody', ['orgs', 'create', 'evil', '--name', 'Evil']);
  t.equal(r.code, 4);
  t.match(r.stderr, /^dvx: 403 /);
  t.equal(r.stderr.trim().split('\n').length, 1);
  const l = await cli.as('root', ['orgs', 'get', 'evil']);
  t.equal(l.code, 5, 'nothing was created');
});

t.test('orgs: bad input fails locally, exit 2, nothing sent', async (t) => {
  const bad = await cli.as('root', ['orgs', 'create', 'Not_Valid!', '--name', 'x']);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /org "Not_Valid!" is not valid/);
  const json = await cli.as('root', ['orgs', 'create', '--file', '-'], { stdin: '{"id": "zeta", ' });
  t.equal(json.code, 2);
  t.match(json.stderr, /--file \(stdin\) is not valid JSON/);
  const both = await cli.as('root', ['orgs', 'create', 'zeta', '--name', 'Z', '--file', '-'], { stdin: '{}' });
  t.equal(both.code, 2);
  t.match(both.stderr, /alternatives/);
  const status = await cli.as('root', ['orgs', 'set', 'acme', '--status', 'gone']);
  t.equal(status.code, 2);
  const list = await cli.as('root', ['orgs', 'list']);
  t.notOk(
    (JSON.parse(list.stdout) as { id: string }[]).some((o) => o.id === 'zeta'),
    'nothing created',
  );
});

t.test('groups: create, list, delete; --org is required', async (t) => {
  const c = await cli.as('root', ['groups', 'create', 'eng', '--org', 'acme', '--name', 'Engineering']);
  t.equal(c.code, 0, c.stderr);
  t.match(JSON.parse(c.stdout), { id: 'eng', name: 'Engineering', org_id: 'acme' });
  const l = await cli.as('root', ['groups', 'list', '--org', 'acme']);
  t.match(JSON.parse(l.stdout), [{ id: 'eng' }]);
  const noOrg = await cli.as('root', ['groups', 'list']);
  t.equal(noOrg.code, 2);
  t.match(noOrg.stderr, /--org ORG is required/);
  const missing = await cli.as('root', ['groups', 'list', '--org', 'nope']);
  t.equal(missing.code, 5);
  const refused = await cli.as('nobody', ['groups', 'create', 'x', '--org', 'acme']);
  t.equal(refused.code, 4);
  const tmp = await cli.as('root', ['groups', 'create', 'tmp', '--org', 'acme']);
  t.equal(tmp.code, 0, tmp.stderr);
  const d = await cli.as('root', ['groups', 'delete', 'tmp', '--org', 'acme']);
  t.equal(d.code, 0, d.stderr);
  t.equal(d.stdout, '');
});

t.test('members: set, list, group-add, effective, group-remove, offboard', async (t) => {
  const s = await cli.as('root', ['members', 'set', 'alice', '--org', 'acme', '--email', 'alice@example.com']);
  t.equal(s.code, 0, s.stderr);
  t.match(JSON.parse(s.stdout), { subject: 'alice', email: 'alice@example.com' });
  const l = await cli.as('root', ['members', 'list', '--org', 'acme']);
  t.match(JSON.parse(l.stdout), [{ subject: 'alice' }]);
  const add = await cli.as('root', ['members', 'group-add', 'alice', '--org', 'acme', '--group', 'eng']);
  t.equal(add.code, 0, add.stderr);
  t.equal(add.stdout, '');
  const e = await cli.as('root', ['members', 'effective', 'alice', '--org', 'acme']);
  t.equal(e.code, 0, e.stderr);
  t.match(JSON.parse(e.stdout), { subject: 'alice', org_id: 'acme', groups: ['eng'] });
  const rm = await cli.as('root', ['members', 'group-remove', 'alice', '--org', 'acme', '--group', 'eng']);
  t.equal(rm.code, 0, rm.stderr);
  const noGroup = await cli.as('root', ['members', 'group-add', 'alice', '--org', 'acme']);
  t.equal(noGroup.code, 2);
  const off = await cli.as('root', ['members', 'offboard', 'alice', '--org', 'acme']);
  t.equal(off.code, 0, off.stderr);
  t.match(JSON.parse(off.stdout), { subject: 'alice' });
  const refused = await cli.as('nobody', ['members', 'list', '--org', 'acme']);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
});
