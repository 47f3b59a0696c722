import t from 'tap';
import { join } from 'node:path';
import { runDvx } from '../fixtures/run-dvx.ts';
import { tlsDir } from '../fixtures/tls-dir.ts';

// `dvx serve llmproxy` flags that take a duration read the flag, then DVX_*, and refuse what they
// cannot use before anything starts (the flags exist only on the command line: this runs the binary).
const base = ['serve', 'llmproxy', '--tls-cert', 'cert.pem', '--tls-key', 'key.pem', '--agent-jwks', 'jwks.json'];

t.test('--upstream-timeout and --upstream-idle-timeout: flag or environment, checked', async (t) => {
  for (const [args, env, message] of [
    [['--upstream-timeout', 'soon'], {}, /--upstream-timeout <duration>' argument 'soon' is invalid/],
    [
      [],
      { DVX_UPSTREAM_IDLE_TIMEOUT: 'soon' },
      /--upstream-idle-timeout <duration>'.*'soon'.*DVX_UPSTREAM_IDLE_TIMEOUT.*invalid/,
    ],
    [['--upstream-timeout', '0s'], {}, /--upstream-timeout must be positive/],
    [[], { DVX_UPSTREAM_IDLE_TIMEOUT: '0s' }, /--upstream-idle-timeout must be positive/],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...base, ...args], { env });
    t.equal(r.code, 2, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.match(r.stderr, message);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--upstream-timeout <duration> .*?\(default: 600000, env: DVX_UPSTREAM_TIMEOUT\)/);
  t.match(help, /--upstream-idle-timeout <duration> .*?\(default: 300000, env: DVX_UPSTREAM_IDLE_TIMEOUT\)/);
});

t.test('--approvals-url, --escalation-timeout, --inspection-disclosure: flag or environment, checked', async (t) => {
  for (const [args, env, message] of [
    [['--escalation-timeout', 'soon'], {}, /--escalation-timeout <duration>' argument 'soon' is invalid/],
    [['--escalation-timeout', '0s'], {}, /--escalation-timeout must be from 1s to 1h/],
    [[], { DVX_ESCALATION_TIMEOUT: '2h' }, /--escalation-timeout must be from 1s to 1h/],
    [
      ['--inspection-disclosure', 'loud'],
      {},
      /--inspection-disclosure <mode>' argument 'loud' is invalid.*detailed, opaque/,
    ],
    [[], { DVX_INSPECTION_DISCLOSURE: 'loud' }, /DVX_INSPECTION_DISCLOSURE.*invalid/],
    [['--approvals-url', 'http://broker:8450'], {}, /--approvals-url must be https/],
    [[], { DVX_APPROVALS_URL: 'https://broker:8450' }, /--approvals-url needs --secret-broker-token-file/],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...base, ...args], { env });
    t.equal(r.code, 2, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.match(r.stderr, message);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--approvals-url <url> .*?\(default: "", env: DVX_APPROVALS_URL\)/);
  t.match(help, /--escalation-timeout <duration> .*?\(default: 300000, env: DVX_ESCALATION_TIMEOUT\)/);
  t.match(
    help,
    /--inspection-disclosure <mode> .*?\(choices: "detailed", "opaque", default: "detailed", env: DVX_INSPECTION_DISCLOSURE\)/,
  );
});

t.test('--gateway-key: flag or environment; an unreadable key refuses the start', async (t) => {
  const tls = await tlsDir('dvx-cli-gwkey-');
  t.teardown(() => tls.remove());
  const args = ['serve', 'llmproxy', '--addr', '127.0.0.1:0', '--tls-cert', tls.cert, '--tls-key', tls.key];
  for (const [extra, env] of [
    [['--gateway-key', join(tls.dir, 'missing.pem')], {}],
    [[], { DVX_GATEWAY_KEY: join(tls.dir, 'missing.pem') }],
  ] as [string[], Record<string, string>][]) {
    const r = await runDvx([...args, ...extra], { env });
    t.equal(r.code, 2, JSON.stringify(env));
    t.match(r.stderr, /cannot read --gateway-key .*missing\.pem: ENOENT/);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--gateway-key <file> .*?\(default: "", env: DVX_GATEWAY_KEY\)/);
});
