import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { allSecretsOf } from '../../../enclave/broker/secrets.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { DVX_BIN } from '../../fixtures/run-dvx.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';
import { operatorCli } from './operator-cli-fixture.ts';

// dvx secret against a real broker's operator listener (TLS, PGlite, a real OIDC issuer): values from
// stdin and from a file, never from argv (there is no value argument, and the running process's command
// line holds none); the scopes; names and values checked locally (exit 2, nothing stored); refusals.

const b = await startBrokerHarness({ seedAdmin: ['admin-a'] }, [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'nobody-a', org: 'org-a', human: true },
]);
t.teardown(() => b.close());
await addAgent(b, 'agent-1', 'org-a', 'g-1');
const broker = `https://127.0.0.1:${b.broker.operatorPort}`;
const cli = await operatorCli(t, b.issuer!, b.tls.ca.certPem, null);
const secretsOf = () => allSecretsOf(b.broker.deps, { uid: 'agent-1', org_id: 'org-a', group_id: 'g-1' });

t.test('set from stdin (one trailing line break dropped), from a file; list shows no value', async (t) => {
  const set = await cli.json('admin-a', ['secret', 'set', 'api_key', '--agent', 'agent-1'], {
    broker,
    stdin: 's3cr3t-from-stdin\n',
  });
  t.same(set, { name: 'api_key', scope: 'agent:agent-1' });
  const file = join(cli.dir, 'group-secret');
  await writeFile(file, 'from-a-file', { mode: 0o600 });
  await cli.json('admin-a', ['secret', 'set', 'db_password', '--group', 'g-1', '--file', file], { broker });
  await cli.json('admin-a', ['secret', 'set', 'llmproxy:llm.api_key'], { broker, stdin: 'org-key' });
  t.match(await secretsOf(), {
    api_key: 's3cr3t-from-stdin',
    db_password: 'from-a-file',
    'llmproxy:llm.api_key': 'org-key',
  });
  const list = await cli.dvx('admin-a', ['secret', 'list'], { broker });
  t.equal(list.code, 0, list.stderr);
  const rows = JSON.parse(list.stdout) as { name: string; scope: string }[];
  t.same(rows.map((r) => `${r.scope} ${r.name}`).sort(), [
    'agent:agent-1 api_key',
    'group:org-a:g-1 db_password',
    'org:org-a llmproxy:llm.api_key',
  ]);
  t.notMatch(list.stdout, /s3cr3t|from-a-file|org-key/, 'no value is ever printed');
  const del = await cli.dvx('admin-a', ['secret', 'delete', 'db_password', '--group', 'g-1'], { broker });
  t.equal(del.code, 0, del.stderr);
  t.equal(del.stdout, '');
  t.match(del.stderr, /deleted secret db_password of group g-1/);
  t.notOk('db_password' in (await secretsOf()));
  const again = await cli.dvx('admin-a', ['secret', 'delete', 'db_password', '--group', 'g-1'], { broker });
  t.equal(again.code, 5);
  t.match(again.stderr, /^dvx: 404 /);
});

t.test('the value never travels in argv', async (t) => {
  const extra = await cli.dvx('admin-a', ['secret', 'set', 'leak', 'the-value-as-an-argument'], {
    broker,
    stdin: 'x',
  });
  t.equal(extra.code, 2, 'there is no value argument');
  t.match(extra.stderr, /too many arguments/);
  t.notOk('leak' in (await secretsOf()), 'nothing stored');

  // A running `dvx secret set`: its command line (what ps shows) names the secret, never the value.
  const token = join(cli.dir, 'argv.token');
  await writeFile(token, await b.issuer!.token('admin-a'), { mode: 0o600 });
  const env: Record<string, string | undefined> = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('DVX_')) delete env[k];
  const child = spawn(DVX_BIN, ['secret', 'set', 'argv_check', '--agent', 'agent-1'], {
    env: { ...env, DVX_BROKER: broker, DVX_TOKEN_FILE: token, DVX_CA_CERT: cli.ca },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const exited = once(child, 'exit');
  // bin/dvx execs node in the same process: wait until the command line is node's.
  let cmdline = '';
  while (!cmdline.includes('main.ts')) {
    cmdline = (await readFile(`/proc/${child.pid}/cmdline`, 'utf8').catch(() => '')).replaceAll('\0', ' ');
    await new Promise((r) => setTimeout(r, 20));
  }
  child.stdin.end('value-sent-on-stdin');
  const [code] = await exited;
  t.equal(code, 0);
  t.match(cmdline, /secret set argv_check --agent agent-1/);
  t.notMatch(cmdline, /value-sent-on-stdin/);
  t.equal((await secretsOf()).argv_check, 'value-sent-on-stdin');
});

t.test('bad input fails locally with exit 2, nothing sent; refusals are one line', async (t) => {
  for (const [args, stdin, message] of [
    [['secret', 'set', 'bad name'], 'v', /secret name "bad name" must be/],
    [['secret', 'set', 'empty'], '\n', /the secret value is empty/],
    [['secret', 'set', 'both', '--agent', 'a', '--group', 'g'], 'v', /alternatives/],
    [['secret', 'set', 'big'], 'x'.repeat(64 * 1024 + 1), /larger than 65536 bytes/],
    [['secret', 'set', 'nofile', '--file', join(cli.dir, 'missing')], '', /cannot read the secret value .*ENOENT/],
  ] as [string[], string, RegExp][]) {
    const r = await cli.dvx('admin-a', args, { broker: 'https://127.0.0.1:1', stdin });
    t.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.match(r.stderr, message);
  }
  const binary = await cli.dvx('admin-a', ['secret', 'set', 'bin'], { broker, stdin: Buffer.from([0xff, 0xfe, 0x41]) });
  t.equal(binary.code, 2);
  t.match(binary.stderr, /not UTF-8 text/);
  t.notOk('bin' in (await secretsOf()));
  const refused = await cli.dvx('nobody-a', ['secret', 'set', 'x'], { broker, stdin: 'v' });
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
  t.notOk('x' in (await secretsOf()));
  const unknownAgent = await cli.dvx('admin-a', ['secret', 'set', 'y', '--agent', 'ghost'], { broker, stdin: 'v' });
  t.equal(unknownAgent.code, 5);
  const noBroker = await cli.dvx('admin-a', ['secret', 'list']);
  t.equal(noBroker.code, 2);
  t.match(noBroker.stderr, /--broker is required/);
});
