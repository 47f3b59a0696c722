import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { cpUrl, operatorCli } from './operator-cli-fixture.ts';

// dvx packs against a real control plane: define from a file or stdin (validated locally by the
// control plane's own validators), redefine, list, get, install and uninstall at a scope; refusals and
// absences as one Problem line.

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'nobody', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
const cli = await operatorCli(t, h.issuer, h.ca, cpUrl(h));

t.test('create, list, get, install, uninstall', async (t) => {
  const file = join(cli.dir, 'pack.json');
  await writeFile(file, JSON.stringify({ allow: [{ host: 'pypi.org', port: 443 }], deny: [] }));
  t.same(await cli.json('root', ['packs', 'create', 'python', '--file', file]), { pack: 'python', published: false });
  t.match(await cli.json('root', ['packs', 'get', 'python']), { name: 'python', allow: [{ host: 'pypi.org' }] });
  await cli.json('root', ['packs', 'set', 'python', '--file', '-'], {
    stdin: JSON.stringify({ allow: [{ host: 'files.pythonhosted.org' }] }),
  });
  t.match(await cli.json('root', ['packs', 'list']), [{ name: 'python', allow: [{ host: 'files.pythonhosted.org' }] }]);
  t.same(await cli.json('root', ['packs', 'install', 'python', '--org', 'org-a']), {
    pack: 'python',
    scope: 'org:org-a',
    installed: true,
    published: false,
  });
  const un = await cli.dvx('root', ['packs', 'uninstall', 'python', '--org', 'org-a']);
  t.equal(un.code, 0, un.stderr);
  t.equal(un.stdout, '');
  t.match(un.stderr, /uninstalled python at org:org-a/);
  const again = await cli.dvx('root', ['packs', 'uninstall', 'python', '--org', 'org-a']);
  t.equal(again.code, 5);
  t.match(again.stderr, /^dvx: 404 .*not installed at org:org-a/);
  const missing = await cli.dvx('root', ['packs', 'install', 'nope']);
  t.equal(missing.code, 5);
});

t.test('an invalid definition fails locally: exit 2, nothing stored; refusals exit 4', async (t) => {
  for (const [args, stdin, message] of [
    [['packs', 'create', 'Bad Name', '--file', '-'], '{}', /pack name "Bad Name" must be/],
    [['packs', 'create', 'x', '--file', '-'], '{"allow":[{"cidr":"300.0.0.0/8"}]}', /invalid pack: allow\[0\]/],
    [['packs', 'create', 'x', '--file', '-'], '{"extra":1}', /invalid pack: extra: unknown field/],
    [['packs', 'create', 'x', '--file', '-'], '[1]', /must hold a JSON object/],
    [['packs', 'create', 'x', '--file', '-'], '{"name":"y"}', /the file names pack "y"/],
  ] as [string[], string, RegExp][]) {
    const r = await cli.dvx('root', args, { stdin, url: 'https://127.0.0.1:1' });
    t.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.match(r.stderr, message);
  }
  t.same(
    (await h.call('root', 'GET', '/packs')).body.map((p: { name: string }) => p.name),
    ['python'],
  );
  const refused = await cli.dvx('nobody', ['packs', 'list']);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
});
