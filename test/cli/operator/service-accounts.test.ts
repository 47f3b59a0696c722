import { readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { startOperatorCli } from '../../fixtures/operator-cli.ts';

// dvx service-accounts against a real control plane and IdP: the key goes to --key-out (0600, never
// over an existing file, never on stdout), keys and grants, the Problem paths.

const cli = await startOperatorCli(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'nobody', org: 'org-a' },
  ],
  ['root'],
);
t.teardown(() => cli.close());
await cli.as('root', ['orgs', 'create', 'acme']);

t.test('create writes the key to --key-out, 0600, and prints the account without it', async (t) => {
  const key = join(cli.dir, 'sa.key.json');
  const c = await cli.as('root', ['service-accounts', 'create', 'ci-bot', '--org', 'acme', '--key-out', key]);
  t.equal(c.code, 0, c.stderr);
  const account = JSON.parse(c.stdout);
  t.match(account, { org_id: 'acme', level: 'org' });
  t.notOk('credential' in account, 'the key is not printed');
  t.equal((await stat(key)).mode & 0o777, 0o600);
  const file = JSON.parse(await readFile(key, 'utf8'));
  t.ok(file && typeof file === 'object', 'the key file holds the credential');
  t.notMatch(c.stdout, /"d"\s*:/, 'no private key material on stdout');

  const l = await cli.as('root', ['service-accounts', 'list', '--org', 'acme']);
  t.ok((JSON.parse(l.stdout) as { id: string }[]).some((a) => a.id === account.id));
  const g = await cli.as('root', ['service-accounts', 'get', account.id, '--org', 'acme']);
  t.match(JSON.parse(g.stdout), { id: account.id });

  const key2 = join(cli.dir, 'sa2.key.json');
  const k = await cli.as('root', [
    'service-accounts',
    'keys',
    'create',
    account.id,
    '--org',
    'acme',
    '--key-out',
    key2,
  ]);
  t.equal(k.code, 0, k.stderr);
  const added = JSON.parse(k.stdout);
  t.ok(added.id);
  const kd = await cli.as('root', ['service-accounts', 'keys', 'delete', account.id, added.id, '--org', 'acme']);
  t.equal(kd.code, 0, kd.stderr);
  t.equal(kd.stdout, '');

  const gc = await cli.as('root', [
    'service-accounts',
    'grants',
    'create',
    account.id,
    '--org',
    'acme',
    '--capability',
    'audit:read',
  ]);
  t.equal(gc.code, 0, gc.stderr);
  const grant = JSON.parse(gc.stdout);
  const gl = await cli.as('root', ['service-accounts', 'grants', 'list', account.id, '--org', 'acme']);
  t.match(JSON.parse(gl.stdout), [{ id: grant.id, capability: 'audit:read' }]);
  const gd = await cli.as('root', [
    'service-accounts',
    'grants',
    'delete',
    account.id,
    String(grant.id),
    '--org',
    'acme',
  ]);
  t.equal(gd.code, 0, gd.stderr);

  const dis = await cli.as('root', ['service-accounts', 'disable', account.id, '--org', 'acme']);
  t.equal(dis.code, 0, dis.stderr);
  t.match(JSON.parse(dis.stdout), { status: 'disabled' });
});

t.test('--key-out: required, never over an existing file; a refused call leaves no file', async (t) => {
  const none = await cli.as('root', ['service-accounts', 'create', 'x', '--org', 'acme']);
  t.equal(none.code, 2);
  t.match(none.stderr, /--key-out FILE is required/);
  const existing = join(cli.dir, 'existing.json');
  await writeFile(existing, 'keep me');
  const over = await cli.as('root', ['service-accounts', 'create', 'y', '--org', 'acme', '--key-out', existing]);
  t.equal(over.code, 2);
  t.match(over.stderr, /exists; refusing to overwrite/);
  t.equal(await readFile(existing, 'utf8'), 'keep me');
  const l = await cli.as('root', ['service-accounts', 'list', '--org', 'acme']);
  t.equal((JSON.parse(l.stdout) as unknown[]).length, 1, 'nothing was created');
  const refusedKey = join(cli.dir, 'refused.json');
  const refused = await cli.as('nobody', ['service-accounts', 'create', 'z', '--org', 'acme', '--key-out', refusedKey]);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
  await t.rejects(stat(refusedKey), { code: 'ENOENT' }, 'the empty key file is removed');
  const missing = await cli.as('root', ['service-accounts', 'get', 'no-such', '--org', 'acme']);
  t.equal(missing.code, 5);
});
