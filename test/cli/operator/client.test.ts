import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { AUDIENCE } from '../../fixtures/oidc-issuer.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';

// The operator client as a person uses it: the real `bin/dvx` against a real control plane over TLS and
// a real OIDC provider — a token file and a minted --idp-key, the CA, profiles, output formats, Problem
// lines and exit codes.

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'nobody', org: 'org-a' },
  ],
  {
    seedAdmin: ['root'],
  },
);
const dir = await mkdtemp(join(tmpdir(), 'dvx-cli-client-'));
t.teardown(async () => {
  await h.close();
  await rm(dir, { recursive: true, force: true });
});
const ca = join(dir, 'ca.pem');
await writeFile(ca, h.ca);
const rootToken = join(dir, 'root.token');
await writeFile(rootToken, await h.issuer.token('root'));
const url = `https://127.0.0.1:${h.cp.port}`;
const env = { XDG_CONFIG_HOME: join(dir, 'xdg') };

t.test('whoami with a token file and the CA: JSON when piped, exit 0', async (t) => {
  const r = await runDvx(['whoami', '--controlplane', url, '--token-file', rootToken, '--ca-cert', ca], { env });
  t.equal(r.code, 0, r.stderr);
  const body = JSON.parse(r.stdout);
  t.match(body, { subject: 'root' });
});

t.test('--output jsonl and table', async (t) => {
  const jl = await runDvx(
    ['whoami', '--controlplane', url, '--token-file', rootToken, '--ca-cert', ca, '--output', 'jsonl'],
    { env },
  );
  t.equal(jl.stdout.trim().split('\n').length, 1);
  t.match(JSON.parse(jl.stdout), { subject: 'root' });
  const tb = await runDvx(
    ['whoami', '--controlplane', url, '--token-file', rootToken, '--ca-cert', ca, '--output', 'table'],
    { env },
  );
  t.match(tb.stdout, /^FIELD\s+VALUE\n/);
  t.match(tb.stdout, /subject\s+root/);
});

t.test('the CA not given: one line naming the fix, exit 3; --insecure-skip-verify warns and works', async (t) => {
  const r = await runDvx(['whoami', '--controlplane', url, '--token-file', rootToken], { env });
  t.equal(r.code, 3);
  t.match(r.stderr, /^dvx: cannot reach https:\/\/127\.0\.0\.1:\d+: TLS certificate not trusted .*--ca-cert/);
  t.equal(r.stderr.trim().split('\n').length, 1);
  const k = await runDvx(['whoami', '--controlplane', url, '--token-file', rootToken, '--insecure-skip-verify'], {
    env,
  });
  t.equal(k.code, 0, k.stderr);
  t.match(k.stderr, /warning: TLS certificates are not verified/);
  const off = await runDvx(['whoami', '--controlplane', url, '--token-file', rootToken, '--ca-cert', ca], {
    env: { ...env, DVX_INSECURE_SKIP_VERIFY: 'false' },
  });
  t.equal(off.code, 0);
  t.notMatch(off.stderr, /warning/, 'DVX_INSECURE_SKIP_VERIFY=false is off');
});

t.test('a refused token: the Problem as one line, exit 4; nothing to reach: exit 3', async (t) => {
  const bad = join(dir, 'bad.token');
  await writeFile(bad, 'not-a-jwt');
  const r = await runDvx(['whoami', '--controlplane', url, '--token-file', bad, '--ca-cert', ca], { env });
  t.equal(r.code, 4);
  t.match(r.stderr, /^dvx: 401 /);
  const down = await runDvx(['whoami', '--controlplane', 'https://127.0.0.1:1', '--token-file', rootToken], { env });
  t.equal(down.code, 3);
  t.match(down.stderr, /connection refused/);
});

t.test('--idp-key mints its own token at --issuer for --audience', async (t) => {
  // The IdP's admin client key is a service-account key like any other.
  const key = join(dir, 'admin-key.json');
  await writeFile(key, JSON.stringify(h.issuer.adminKey), { mode: 0o600 });
  const r = await runDvx(
    [
      'whoami',
      '--controlplane',
      url,
      '--idp-key',
      key,
      '--issuer',
      h.issuer.issuer,
      '--audience',
      AUDIENCE,
      '--ca-cert',
      ca,
    ],
    { env },
  );
  // The admin client holds no grant: whoami still answers (it needs only a valid token).
  t.equal(r.code, 0, r.stderr);
  t.match(JSON.parse(r.stdout), { subject: 'dvx-controlplane' });
  const wrong = await runDvx(
    ['whoami', '--controlplane', url, '--idp-key', key, '--issuer', 'http://127.0.0.1:9', '--ca-cert', ca],
    { env },
  );
  t.equal(wrong.code, 2);
  t.match(wrong.stderr, /belongs to issuer/);
  const both = await runDvx(['whoami', '--controlplane', url, '--idp-key', key, '--token-file', rootToken], { env });
  t.equal(both.code, 2);
  t.match(both.stderr, /alternatives/);
});

t.test('profiles: set once, used by default, chosen with --profile, flags win', async (t) => {
  const set = await runDvx(
    ['profile', 'set', 'main', '--controlplane', url, '--token-file', rootToken, '--ca-cert', ca, '--use'],
    { env },
  );
  t.equal(set.code, 0, set.stderr);
  const file = join(dir, 'xdg', 'dvx', 'config.json');
  const doc = JSON.parse(await readFile(file, 'utf8'));
  t.equal(doc.default_profile, 'main');
  t.equal(doc.profiles.main.token_file, rootToken);
  const r = await runDvx(['whoami'], { env });
  t.equal(r.code, 0, r.stderr);
  t.match(JSON.parse(r.stdout), { subject: 'root' });
  const missing = await runDvx(['whoami', '--profile', 'nope'], { env });
  t.equal(missing.code, 2);
  t.match(missing.stderr, /no profile "nope"/);
  const flagWins = await runDvx(['whoami', '--controlplane', 'https://127.0.0.1:1'], { env });
  t.equal(flagWins.code, 3, 'the flag replaces the profile value');
  const list = await runDvx(['profile', 'list', '--output', 'json'], { env });
  t.match(JSON.parse(list.stdout), [{ name: 'main', default: true }]);
  await chmod(file, 0o600);
  await writeFile(file, '{"profiles":{"x":{"controlplane":"ftp://a"}}}');
  const broken = await runDvx(['whoami'], { env });
  t.equal(broken.code, 2);
  t.match(broken.stderr, /controlplane must be an http\(s\) URL/);
});
