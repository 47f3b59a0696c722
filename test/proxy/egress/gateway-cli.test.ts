import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { until } from '../../fixtures/eventually.ts';
import { DVX_BIN, runDvx } from '../../fixtures/run-dvx.ts';
import { baseSnapshot, curl, startHttps } from './gateway-harness.ts';

// `dvx serve gateway` as an operator runs it: the real binary in a child process. Its flags and their
// DVX_* variables (rule flags repeat and keep their commas; --http-capture takes every spelling of a
// boolean), a bad rule refusing the start with a clear message, and a running gateway that tunnels and
// writes its network_flow records on stdout, then stops on SIGTERM.

const dir = await mkdtemp(join(tmpdir(), 'dvx-gateway-cli-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const ca = await generateCa('gateway cli CA');
const leaf = await issueCertificate(ca, {
  commonName: 'localhost',
  dnsNames: ['localhost'],
  ipAddresses: ['127.0.0.1'],
});
const file = (name: string) => join(dir, name);
await writeFile(file('cert.pem'), leaf.certPem);
await writeFile(file('key.pem'), leaf.keyPem);
await writeFile(file('ca.pem'), ca.certPem);
const issuer = await tokenIssuer();
await writeFile(file('jwks.json'), JSON.stringify(issuer.jwks));
await writeFile(file('snapshot.json'), JSON.stringify(baseSnapshot()));
await writeFile(file('secrets.json'), JSON.stringify({ 'agent:agent-1': { gh: 'ghp_x' } }));

const base = [
  'serve',
  'gateway',
  '--addr',
  '127.0.0.1:0',
  '--tls-cert',
  file('cert.pem'),
  '--tls-key',
  file('key.pem'),
  '--agent-jwks',
  file('jwks.json'),
  '--policy-snapshot',
  file('snapshot.json'),
];

interface Child {
  process: ChildProcessWithoutNullStreams;
  lines: Record<string, unknown>[];
  listening: Record<string, unknown>;
  port: number;
  stop(): Promise<number | null>;
}

/** Starts `dvx serve gateway` and resolves with its "gateway listening" log line. */
async function startChild(args: string[], env: Record<string, string> = {}): Promise<Child> {
  const childEnv: Record<string, string | undefined> = { ...process.env, ...env };
  for (const k of Object.keys(childEnv)) if (k.startsWith('DVX_') && !(k in env)) delete childEnv[k];
  const child = spawn(DVX_BIN, args, { env: childEnv, stdio: ['pipe', 'pipe', 'pipe'] });
  const lines: Record<string, unknown>[] = [];
  let pending = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => {
    pending += d.toString('utf8');
    let nl = pending.indexOf('\n');
    while (nl >= 0) {
      lines.push(JSON.parse(pending.slice(0, nl)));
      pending = pending.slice(nl + 1);
      nl = pending.indexOf('\n');
    }
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const stop = async () => {
    if (child.exitCode === null) child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    const code = await exited;
    clearTimeout(timer);
    return code;
  };
  const up = await until(() => lines.some((l) => l.msg === 'gateway listening') || child.exitCode !== null, 30_000);
  const listening = lines.find((l) => l.msg === 'gateway listening');
  if (!up || !listening) {
    await stop();
    throw new Error(`the gateway did not start: ${stderr}`);
  }
  return { process: child, lines, listening, port: (listening.addr as { port: number }).port, stop };
}

t.test('--help lists the gateway flags with their variables', async (t) => {
  const help = (await runDvx(['serve', 'gateway', '--help'])).stdout.replace(/\s+/g, ' ');
  for (const f of [
    /--addr <addr> listen address \(default: ":8460", env: DVX_ADDR\)/,
    /--allow-dest <rule> .*?env: DVX_ALLOW_DEST\)/,
    /--deny-dest <rule> .*?env: DVX_DENY_DEST\)/,
    /--inject-cred <rule> .*?env: DVX_INJECT_CRED\)/,
    /--http-capture \[bool\] .*?\(default: true, env: DVX_HTTP_CAPTURE\)/,
    /--no-capture-host <glob> .*?env: DVX_NO_CAPTURE_HOST\)/,
    /--llm-host <glob> .*?env: DVX_LLM_HOST\)/,
    /--connect-timeout <duration> .*?\(default: 10000, env: DVX_CONNECT_TIMEOUT\)/,
    /--tunnel-idle-timeout <duration> .*?\(default: 600000, env: DVX_TUNNEL_IDLE_TIMEOUT\)/,
    /--max-connections-per-client <n> .*?\(default: 256, env: DVX_MAX_CONNECTIONS_PER_CLIENT\)/,
    /--audit-dsn <dsn>/,
    /--audit-capture-or-deny/,
  ])
    t.match(help, f);
});

t.test('a rule that does not parse refuses the start, naming the flag and the rule', async (t) => {
  for (const [args, env, message] of [
    [
      ['--allow-dest', 'host=a.test,port=99999'],
      {},
      /--allow-dest "host=a\.test,port=99999": rule\[0\]\.port: must be an integer/,
    ],
    [['--deny-dest', '{"host": 1'], {}, /--deny-dest "\{"host": 1": not valid JSON/],
    [[], { DVX_DENY_DEST: 'ok.test\nhost=,port=1' }, /--deny-dest "host=,port=1"/],
    [
      ['--secrets-file', file('secrets.json'), '--inject-cred', 'host=api.github.test,secret=gh'],
      {},
      /--inject-cred "host=api\.github\.test,secret=gh": header must be an HTTP header name/,
    ],
    [['--inject-cred', 'host=x.test,header=Authorization,secret=gh'], {}, /--inject-cred needs a secret source/],
    [['--tunnel-idle-timeout', 'soon'], {}, /--tunnel-idle-timeout <duration>' argument 'soon' is invalid/],
    [['--http-capture=maybe'], {}, /--http-capture \[bool\]' argument 'maybe' is invalid/],
    [[], { DVX_HTTP_CAPTURE: 'maybe' }, /DVX_HTTP_CAPTURE.*invalid|argument 'maybe' is invalid/],
    [['--ca-cert', file('ca.pem')], {}, /--ca-cert and --ca-key go together/],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...base, ...args], { env });
    t.not(r.code, 0, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.match(r.stderr, message, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.notMatch(r.stderr, /\n\s+at /, 'no stack trace');
  }
});

t.test('--http-capture: on by default; the flag, its negation, a value, the variable', async (t) => {
  for (const [args, env, expected] of [
    [[], {}, true],
    [['--no-http-capture'], {}, false],
    [['--http-capture=false'], {}, false],
    [['--http-capture=true'], {}, true],
    [['--http-capture'], { DVX_HTTP_CAPTURE: 'false' }, true],
    [[], { DVX_HTTP_CAPTURE: 'false' }, false],
    [[], { DVX_HTTP_CAPTURE: 'true' }, true],
  ] as [string[], Record<string, string>, boolean][]) {
    const child = await startChild([...base, ...args], env);
    t.equal(child.listening.http_capture, expected, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.equal(await child.stop(), 0);
  }
});

t.test('a running gateway: repeated rules keep their commas, tunnels, records on stdout, SIGTERM', async (t) => {
  const https = await startHttps(ca);
  t.teardown(() => https.close());
  const child = await startChild(
    [
      ...base,
      '--allow-dest',
      '127.0.0.1',
      '--allow-dest',
      'host=localhost,reason=the local one, with a comma',
      '--deny-dest',
      'host=blocked.test,reason=no, never',
      '--secrets-file',
      file('secrets.json'),
      '--inject-cred',
      'host=api.github.test,header=Authorization,secret=gh,format=token {}, exactly',
      '--no-capture-host',
      'pinned.test,*.bank.test',
      '--no-capture-host',
      'other.test',
      '--tunnel-idle-timeout',
      '2m',
    ],
    { DVX_ENCLAVE_NAME: 'from-env', DVX_ALLOW_DEST: 'ignored.test' },
  );
  t.teardown(() => child.stop());
  t.match(child.listening, {
    allow_dest: 2,
    deny_dest: 1,
    inject_cred: 1,
    no_capture_host: ['pinned.test', '*.bank.test', 'other.test'],
    intercepting: false,
  });
  const token = await issuer.mint();
  const proxy = ['--proxy', `https://127.0.0.1:${child.port}`, '--proxy-cacert', file('ca.pem')];
  const auth = ['--proxy-header', `Proxy-Authorization: Bearer ${token}`];
  const ok = await curl([...proxy, ...auth, '--cacert', file('ca.pem'), `https://127.0.0.1:${https.port}/via-cli`]);
  t.equal(ok.code, 0, ok.stderr);
  t.match(JSON.parse(ok.stdout), { url: '/via-cli' });
  const denied = await curl([...proxy, ...auth, '-w', '%{http_connect}', 'https://blocked.test/']);
  t.equal(denied.stdout, '403');
  const noToken = await curl([...proxy, '-w', '%{http_connect}', `https://127.0.0.1:${https.port}/`]);
  t.equal(noToken.stdout, '407');
  t.ok(
    await until(() => child.lines.filter((l) => l.stream === 'audit' && l.table === 'network_flow').length >= 2),
    'two network_flow records',
  );
  const flows = child.lines.filter((l) => l.table === 'network_flow');
  t.match(flows, [
    { outcome: 'allow', dst_host: '127.0.0.1', enclave_name: 'from-env', attrs: { status: '200' } },
    { outcome: 'deny', dst_host: 'blocked.test', reason: 'no, never', enclave_name: 'from-env' },
  ]);
  t.equal(await child.stop(), 0, 'SIGTERM: a clean exit');
  t.ok(child.lines.some((l) => l.msg === 'gateway stopped'));
});
