import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { cpUrl, operatorCli } from './operator-cli-fixture.ts';

// dvx config against a real control plane: values at platform, org, group and agent scope from
// --value, a file and stdin; a secret declaration carries no value; locks and their 409; local
// validation (exit 2, nothing sent); refusals.

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'nobody', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await h.call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'builder' });
const cli = await operatorCli(t, h.issuer, h.ca, cpUrl(h));

t.test('set, get, list, delete at every scope', async (t) => {
  t.same(await cli.json('root', ['config', 'set', 'log_level', '--value', 'debug']), {
    key: 'log_level',
    scope: 'platform',
    locked: false,
    published: false,
  });
  t.match(await cli.json('root', ['config', 'get', 'log_level']), { value: 'debug', secret: false });
  await cli.json('root', ['config', 'set', 'retries', '--value', '3', '--org', 'org-a']);
  t.match(await cli.json('root', ['config', 'get', 'retries', '--org', 'org-a']), { value: 3 });
  const file = join(cli.dir, 'limits.json');
  await writeFile(file, JSON.stringify({ rps: 5, burst: [1, 2] }));
  await cli.json('root', ['config', 'set', 'limits', '--file', file, '--org', 'org-a', '--group', 'ops']);
  await cli.json('root', ['config', 'set', 'flavour', '--file', '-', '--agent', 'bot-1'], { stdin: '"vanilla"' });
  t.match(await cli.json('root', ['config', 'list', '--scope', 'group', '--org', 'org-a', '--group', 'ops']), [
    { key: 'limits', scope: 'group:org-a:ops', value: { rps: 5, burst: [1, 2] } },
  ]);
  t.match(await cli.json('root', ['config', 'list', '--agent', 'bot-1']), [
    { key: 'flavour', scope: 'agent:bot-1', value: 'vanilla' },
  ]);
  const secret = await cli.json('root', ['config', 'set', 'api_token', '--secret', '--org', 'org-a']);
  t.match(secret, { key: 'api_token', scope: 'org:org-a' });
  t.match(await cli.json('root', ['config', 'get', 'api_token', '--org', 'org-a']), { secret: true, value: null });
  const table = await cli.dvx('root', ['config', 'list', '--org', 'org-a', '--output', 'table']);
  t.match(table.stdout, /^KEY\s+SCOPE\s+LOCKED\s+SECRET\s+VALUE\n/);
  const del = await cli.dvx('root', ['config', 'delete', 'retries', '--org', 'org-a']);
  t.equal(del.code, 0, del.stderr);
  t.equal(del.stdout, '');
  t.match(del.stderr, /deleted retries at org:org-a/);
  const gone = await cli.dvx('root', ['config', 'get', 'retries', '--org', 'org-a']);
  t.equal(gone.code, 5);
  const again = await cli.dvx('root', ['config', 'delete', 'retries', '--org', 'org-a']);
  t.equal(again.code, 5);
  t.match(again.stderr, /^dvx: 404 .*retries is not set at org:org-a/);
});

t.test('a lock at a broader scope: 409, exit 6', async (t) => {
  await cli.json('root', ['config', 'set', 'region', '--value', 'eu', '--lock']);
  const below = await cli.dvx('root', ['config', 'set', 'region', '--value', 'us', '--org', 'org-a']);
  t.equal(below.code, 6);
  t.match(below.stderr, /^dvx: 409 .*locked at platform/);
});

t.test('local validation: exit 2, nothing sent; refusals: exit 4', async (t) => {
  const before = (await h.call('root', 'GET', '/config')).body;
  for (const [args, stdin, message] of [
    [['config', 'set', 'bad key', '--value', '1'], '', /config key "bad key" must be/],
    [['config', 'set', 'k'], '', /exactly one of --value, --file or --secret/],
    [['config', 'set', 'k', '--value', '1', '--secret'], '', /exactly one of/],
    [['config', 'set', 'k', '--file', '-'], '{oops', /is not valid JSON/],
    // A file without an end is refused at the bound, never read into memory whole.
    [['config', 'set', 'k', '--file', '/dev/zero'], '', /--file \/dev\/zero is larger than 8388608 bytes/],
    [['config', 'set', 'k', '--file', '/nonexistent/dvx'], '', /cannot read --file \/nonexistent\/dvx: ENOENT/],
    [['config', 'set', 'k', '--file', '/'], '', /cannot read --file \/: EISDIR/],
    [['config', 'set', 'k', '--value', '1', '--agent', 'bot-1', '--lock'], '', /--lock is refused at agent scope/],
    [['config', 'list', '--scope', 'org'], '', /org scope needs --org/],
    [['config', 'list', '--org', 'org-a', '--scope', 'platform'], '', /platform scope takes no/],
    [['config', 'list', '--scope', 'nowhere'], '', /argument 'nowhere' is invalid/],
  ] as [string[], string, RegExp][]) {
    const r = await cli.dvx('root', args, { stdin, url: 'https://127.0.0.1:1' });
    t.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.match(r.stderr, message);
  }
  t.same((await h.call('root', 'GET', '/config')).body, before);
  const refused = await cli.dvx('nobody', ['config', 'set', 'x', '--value', '1']);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
  const noOrg = await cli.dvx('root', ['config', 'list', '--org', 'org-nope']);
  t.equal(noOrg.code, 5);
});
