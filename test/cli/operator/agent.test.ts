import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { startOperatorCli } from '../../fixtures/operator-cli.ts';

// dvx agent, dvx enclaves, dvx idp-connectors, dvx erasure and dvx openapi against a real control plane.

const cli = await startOperatorCli(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'nobody', org: 'org-a' },
  ],
  ['root'],
);
t.teardown(() => cli.close());
await cli.as('root', ['orgs', 'create', 'acme']);
await cli.as('root', ['groups', 'create', 'eng', '--org', 'acme']);

t.test('agent: create in a group, list, get, lifecycle, delete', async (t) => {
  const c = await cli.as('root', ['agent', 'create', 'bot-1', '--org', 'acme', '--group', 'eng', '--name', 'Bot']);
  t.equal(c.code, 0, c.stderr);
  t.match(JSON.parse(c.stdout), { uid: 'bot-1', group_id: 'eng', org_id: 'acme' });
  const l = await cli.as('root', ['agent', 'list', '--org', 'acme']);
  t.match(JSON.parse(l.stdout), [{ uid: 'bot-1' }]);
  const s = await cli.as('root', ['agent', 'suspend', 'bot-1', '--org', 'acme']);
  t.equal(s.code, 0, s.stderr);
  t.match(JSON.parse(s.stdout), { status: 'suspended' });
  const r = await cli.as('root', ['agent', 'restore', 'bot-1', '--org', 'acme']);
  t.equal(r.code, 0, r.stderr);
  const i = await cli.as('root', ['agent', 'isolate', 'bot-1', '--org', 'acme']);
  t.match(JSON.parse(i.stdout), { status: 'isolated' });
  const c1 = await cli.as('root', ['agent', 'contain', 'bot-1', '--org', 'acme']);
  t.equal(c1.code, 0, c1.stderr);
  t.match(JSON.parse(c1.stdout), { agent: 'bot-1', contained: true });
  const c2 = await cli.as('root', ['agent', 'release', 'bot-1', '--org', 'acme']);
  t.match(JSON.parse(c2.stdout), { contained: false });
  const g = await cli.as('root', ['agent', 'get', 'bot-1', '--org', 'acme']);
  t.match(JSON.parse(g.stdout), { uid: 'bot-1', contained: false });
  const d = await cli.as('root', ['agent', 'delete', 'bot-1', '--org', 'acme']);
  t.equal(d.code, 0, d.stderr);
  t.equal(d.stdout, '');
  const gone = await cli.as('root', ['agent', 'get', 'bot-1', '--org', 'acme']);
  t.equal(gone.code, 5);
  const refused = await cli.as('nobody', ['agent', 'list', '--org', 'acme']);
  t.equal(refused.code, 4);
  const bad = await cli.as('root', ['agent', 'create', '-bad uid', '--org', 'acme']);
  t.equal(bad.code, 2);
  const badFile = await cli.as('root', ['agent', 'create', '--org', 'acme', '--file', '-'], { stdin: '[1]' });
  t.equal(badFile.code, 2);
  t.match(badFile.stderr, /must hold a JSON object/);
});

t.test('enclaves: create with --key-out, get, set-address, set-isolation-class, rotate-key, delete', async (t) => {
  const key = join(cli.dir, 'broker.key');
  const c = await cli.as('root', [
    'enclaves',
    'create',
    'East',
    '--owning-org',
    'acme',
    '--id',
    'east',
    '--key-out',
    key,
  ]);
  t.equal(c.code, 0, c.stderr);
  t.match(JSON.parse(c.stdout), { enclave_id: 'east', subject: 'enclave:east' });
  t.notMatch(c.stdout, /dvxb_/, 'the broker key is not printed');
  t.equal((await stat(key)).mode & 0o777, 0o600);
  const l = await cli.as('root', ['enclaves', 'list']);
  t.match(JSON.parse(l.stdout), [{ enclave_id: 'east', owning_org_id: 'acme' }]);
  const a = await cli.as('root', ['enclaves', 'set-address', 'east', '--broker-url', 'https://broker.example:8443']);
  t.equal(a.code, 0, a.stderr);
  t.match(JSON.parse(a.stdout), { broker_url: 'https://broker.example:8443' });
  const http = await cli.as('root', ['enclaves', 'set-address', 'east', '--broker-url', 'http://x']);
  t.equal(http.code, 2);
  const iso = await cli.as('root', ['enclaves', 'set-isolation-class', 'east', 'vm']);
  t.equal(iso.code, 0, iso.stderr);
  t.match(JSON.parse(iso.stdout), { isolationClass: 'vm' });
  const badIso = await cli.as('root', ['enclaves', 'set-isolation-class', 'east', 'cloud']);
  t.equal(badIso.code, 2);
  const rot = await cli.as('root', ['enclaves', 'rotate-key', 'east', '--key-out', key]);
  t.equal(rot.code, 2, 'never over the existing key file');
  const rot2 = await cli.as('root', ['enclaves', 'rotate-key', 'east', '--key-out', join(cli.dir, 'broker2.key')]);
  t.equal(rot2.code, 0, rot2.stderr);
  const g = await cli.as('root', ['enclaves', 'get', 'east']);
  t.match(JSON.parse(g.stdout), { enclave_id: 'east' });
  const refused = await cli.as('nobody', ['enclaves', 'delete', 'east']);
  t.equal(refused.code, 4);
  const d = await cli.as('root', ['enclaves', 'delete', 'east']);
  t.equal(d.code, 0, d.stderr);
  t.equal((await cli.as('root', ['enclaves', 'get', 'east'])).code, 5);
});

t.test('idp-connectors: set (secret from a file), list, get, delete', async (t) => {
  const s = await cli.as(
    'root',
    [
      'idp-connectors',
      'set',
      'okta',
      '--org',
      'acme',
      '--type',
      'oidc',
      '--oidc-issuer',
      'https://idp.example',
      '--client-id',
      'dvx',
      '--client-secret-file',
      '-',
    ],
    { stdin: 's3cret\n' },
  );
  t.equal(s.code, 0, s.stderr);
  t.match(JSON.parse(s.stdout), { name: 'okta', type: 'oidc' });
  t.notMatch(s.stdout, /s3cret/);
  const l = await cli.as('root', ['idp-connectors', 'list', '--org', 'acme']);
  t.match(JSON.parse(l.stdout), [{ name: 'okta' }]);
  const g = await cli.as('root', ['idp-connectors', 'get', 'okta', '--org', 'acme']);
  t.equal(g.code, 0, g.stderr);
  const incomplete = await cli.as('root', ['idp-connectors', 'set', 'x', '--org', 'acme', '--type', 'saml']);
  t.equal(incomplete.code, 2);
  t.match(incomplete.stderr, /--metadata-url/);
  const d = await cli.as('root', ['idp-connectors', 'delete', 'okta', '--org', 'acme']);
  t.equal(d.code, 0, d.stderr);
  t.equal((await cli.as('root', ['idp-connectors', 'get', 'okta', '--org', 'acme'])).code, 5);
});

t.test('openapi: the document, parsed', async (t) => {
  const r = await cli.as('root', ['openapi', '--output', 'table']);
  t.equal(r.code, 0, r.stderr);
  t.match(JSON.parse(r.stdout), { openapi: /^3\./, paths: { '/api/v1/orgs': {} } });
});

t.test('erasure: create waits until complete; get; a missing org is 404', async (t) => {
  t.equal((await cli.as('root', ['orgs', 'create', 'doomed'])).code, 0);
  const refused = await cli.as('nobody', ['erasure', 'create', 'doomed']);
  t.equal(refused.code, 4);
  const e = await cli.as('root', ['erasure', 'create', 'doomed', '--interval', '0.2']);
  t.equal(e.code, 0, e.stderr);
  t.match(JSON.parse(e.stdout), { org_id: 'doomed', status: 'complete', rows_swept: Number });
  const g = await cli.as('root', ['erasure', 'get', 'doomed']);
  t.match(JSON.parse(g.stdout), { status: 'complete' });
  const nowait = await cli.as('root', ['erasure', 'create', 'doomed', '--no-wait']);
  t.equal(nowait.code, 0, nowait.stderr);
  t.match(JSON.parse(nowait.stdout), { org_id: 'doomed' });
  const missing = await cli.as('root', ['erasure', 'create', 'never-was']);
  t.equal(missing.code, 5);
  const bad = await cli.as('root', ['erasure', 'create', 'doomed', '--interval', 'soon']);
  t.equal(bad.code, 2);
});
