import t from 'tap';
import { spawn } from 'node:child_process';
import { lstat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { generateCa } from '../../../core/tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { DVX_BIN, runDvx } from '../../fixtures/run-dvx.ts';
import { configDocument, curl, GH_TOKEN, SECRETS, startHarness, tempDir } from './imds-fixture.ts';

// `dvx serve imds` as the operator runs it: the real bin/dvx as a child process. Options that do not
// hold together are refused with one line naming the flag (exit 2; every rule of the one validation:
// options.test.ts); a good start serves on its socket until SIGTERM, then removes it.

t.test('bad flags are refused with a clear message, exit 2', async (t) => {
  const dir = await tempDir(t);
  const sock = join(dir, 'imds.sock');
  const secrets = join(dir, 'secrets.json');
  await writeFile(secrets, JSON.stringify(SECRETS));
  const keyed = join(dir, 'ca-with-key.pem');
  const ca = await generateCa();
  await writeFile(keyed, ca.certPem + ca.keyPem);
  const live = await startHarness(t);

  const cases: [string, string[], RegExp, Record<string, string>?][] = [
    ['no --agent-id', ['--imds-socket', sock], /--agent-id is required/],
    [
      'a world-writable mode',
      ['--imds-socket', sock, '--agent-id', 'a', '--imds-socket-mode', '0666'],
      /must not let every local user connect/,
    ],
    [
      'a mode that is not octal',
      ['--imds-socket', sock, '--agent-id', 'a', '--imds-socket-mode', '9z'],
      /not an octal mode/,
    ],
    [
      'a rule that does not parse',
      ['--imds-socket', sock, '--agent-id', 'a', '--secrets-file', secrets, '--inject-cred', 'host=x.com,secret=s'],
      /--inject-cred "host=x.com,secret=s": header must be an HTTP header name/,
    ],
    [
      'a config snapshot that is not there',
      ['--imds-socket', sock, '--agent-id', 'a', '--config-snapshot', join(dir, 'none.json')],
      /--config-snapshot: cannot read .*ENOENT/,
    ],
    [
      'a CA bundle holding a private key',
      ['--imds-socket', sock, '--agent-id', 'a', '--imds-ca-cert', keyed],
      /--imds-ca-cert .*holds a private key/,
    ],
    ['a socket another imds serves', ['--imds-socket', live.socket, '--agent-id', 'a'], /another server answers/],
    [
      'the same from the environment',
      [],
      /--imds-socket-mode must not let/,
      { DVX_AGENT_ID: 'a', DVX_IMDS_SOCKET: sock, DVX_IMDS_SOCKET_MODE: '777' },
    ],
    [
      'a rule from the environment, kept whole',
      ['--imds-socket', sock, '--agent-id', 'a', '--secrets-file', secrets],
      /--inject-cred "host=x.com,header=Host,secret=s,format=\{\}, b": header Host cannot be injected/,
      { DVX_INJECT_CRED: 'host=x.com,header=Host,secret=s,format={}, b' },
    ],
  ];
  for (const [name, args, message, env] of cases) {
    const res = await runDvx(['serve', 'imds', ...args], env ? { env } : {});
    t.equal(res.code, 2, `${name}: exit 2`);
    t.match(res.stderr, message, name);
    t.notMatch(res.stderr, /\n\s+at /, `${name}: no stack trace`);
  }
  t.equal((await curl(live.socket, '/healthz')).status, 200, 'the live imds was not disturbed');
});

t.test('dvx serve imds serves on its socket until SIGTERM, then removes it', async (t) => {
  const dir = await tempDir(t);
  const sock = join(dir, 'run', 'imds.sock');
  const config = join(dir, 'config.json');
  const secrets = join(dir, 'secrets.json');
  const caFile = join(dir, 'ca.pem');
  const ca = await generateCa();
  await writeFile(config, JSON.stringify(configDocument()));
  await writeFile(secrets, JSON.stringify(SECRETS));
  await writeFile(caFile, ca.certPem);
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('DVX_') && v !== undefined) env[k] = v;
  // Flags win over the environment (spec: "Environment"): this rule is not used.
  env.DVX_INJECT_CRED = 'host=ignored.example,header=X-Ignored,secret=org_token';
  const child = spawn(
    DVX_BIN,
    [
      'serve',
      'imds',
      '--imds-socket',
      sock,
      '--agent-id',
      'agent-1',
      '--config-snapshot',
      config,
      '--imds-ca-cert',
      caFile,
      '--secrets-file',
      secrets,
      '--inject-cred',
      'host=api.github.com,header=Authorization,secret=gh_token,format=token {}, extra',
      '--inject-cred',
      'host=*.corp.example,header=X-Org-Key,secret=org_token,format=Key {}, v=1',
      '--tls-cert',
      caFile,
      '--addr',
      ':8444',
    ],
    { env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  t.teardown(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });
  t.ok(await until(() => stdout.includes('imds listening'), 20_000), `started (stderr: ${stderr})`);

  t.equal((await lstat(sock)).mode & 0o777, 0o660);
  const config1 = await curl(sock, '/v1/config');
  t.equal(JSON.parse(config1.body).org_id, 'org-1');
  const pem = await curl(sock, '/v1/ca');
  t.equal(pem.status, 200);
  t.equal(pem.body.trim(), ca.certPem.trim(), 'the CA bundle');
  const rules = JSON.parse((await curl(sock, '/v1/credentials')).body).credentials;
  t.same(
    rules.map((r: { secret: string; format: string }) => [r.secret, r.format]),
    [
      ['gh_token', 'token {}, extra'],
      ['org_token', 'Key {}, v=1'],
    ],
    'each --inject-cred is one whole rule, commas of its format included; the environment is not used',
  );
  const gh = JSON.parse((await curl(sock, '/v1/credentials/gh_token')).body);
  t.equal(gh.value, `token ${GH_TOKEN}, extra`);

  child.kill('SIGTERM');
  t.equal(await exited, 0, 'exits 0 on SIGTERM');
  await t.rejects(lstat(sock), { code: 'ENOENT' }, 'the socket is removed');
  t.match(stdout, /"stream":"audit","table":"audit_events".*"action":"credential.read"/, 'the audit line on stdout');
  t.match(stdout, /--addr is not opened/, 'the ignored --addr is warned about');
  t.match(stdout, /--tls-cert\/--tls-key serve only --metrics-addr/, 'and the unused TLS flags');
  t.notOk(stdout.replace(/"value":"token [^"]+"/g, '').includes(GH_TOKEN), 'no value in a log line');
});
