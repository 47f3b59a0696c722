import t from 'tap';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runDvx } from '../fixtures/run-dvx.ts';
import { startSidecarServer } from '../fixtures/sidecar-server.ts';

const dir = await mkdtemp(join(tmpdir(), 'dvx-inspect-'));
const sidecars = await startSidecarServer();
t.teardown(async () => {
  await rm(dir, { recursive: true, force: true });
  await sidecars.close();
});

const file = async (name: string, content: string | Buffer) => {
  const p = join(dir, name);
  await writeFile(p, content);
  return p;
};

const policy = await file(
  'policy.json',
  JSON.stringify({
    model_policy: { mode: 'allowlist', models: ['claude-*'] },
    content_inspection: {
      secrets_filter: { enabled: true },
      pii_detection: { enabled: true, severity: 'warn' },
      patterns: [{ pattern: 'nightingale', description: 'codename', severity: 'block' }],
    },
  }),
);
const secrets = await file('secrets.json', JSON.stringify(['hunter2hunter2', 'short']));
const req = (content: string, model = 'claude-haiku') =>
  JSON.stringify({ model, messages: [{ role: 'user', content }] });

t.test('one JSON finding per line; exit 0 when nothing blocks', async (t) => {
  const r = await runDvx(['inspect', '--policy', policy, '-'], { stdin: req('mail a@example.com') });
  t.equal(r.code, 0, r.stderr);
  t.same(
    r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l)),
    [
      {
        inspector_type: 'pii',
        severity: 'warn',
        description: 'email address',
        match: 'a@ex****',
        location: 'request_body',
      },
    ],
  );
});

t.test('exit 1 on a blocking finding; a body file argument works', async (t) => {
  const body = await file('leak.json', req('pw hunter2hunter2'));
  const r = await runDvx(['inspect', '--policy', policy, '--secrets', secrets, body]);
  t.equal(r.code, 1);
  t.match(JSON.parse(r.stdout), { inspector_type: 'secrets', severity: 'block', match: 'hunt****' });
  t.notMatch(r.stdout + r.stderr, /hunter2hunter2/, 'the secret value is never printed');
  t.equal(
    (await runDvx(['inspect', '--policy', policy, '-'], { stdin: req('hi', 'gpt-4o') })).code,
    1,
    'disallowed model',
  );
});

t.test('--phase response is observe-only; DVX_PHASE works too', async (t) => {
  const r = await runDvx(['inspect', '--policy', policy, '--phase', 'response', '-'], {
    stdin: '{"content":[{"type":"text","text":"nightingale"}]}',
  });
  t.equal(r.code, 0);
  t.match(JSON.parse(r.stdout), { inspector_type: 'patterns', severity: 'block', location: 'response_body' });
  const env = await runDvx(['inspect', '--policy', policy, '-'], {
    stdin: '{"x":"nightingale"}',
    env: { DVX_PHASE: 'response' },
  });
  t.equal(env.code, 0);
  t.match(JSON.parse(env.stdout), { location: 'response_body' });
});

t.test('exit 2 with a message naming the problem', async (t) => {
  const badJson = await file('bad.json', '{');
  const badPolicy = await file(
    'invalid.json',
    JSON.stringify({ content_inspection: { pii_detection: { types: ['phone'] } } }),
  );
  const badSecrets = await file('bad-secrets.json', '{"a":1}');
  const cases: [string[], RegExp][] = [
    [['inspect', '-'], /required option '--policy <file>'/],
    [['inspect', '--policy', join(dir, 'missing.json'), '-'], /cannot read policy .*missing\.json: ENOENT/],
    [['inspect', '--policy', badJson, '-'], /policy .*bad\.json is not valid JSON/],
    [['inspect', '--policy', badPolicy, '-'], /content_inspection\.pii_detection\.types\[0\]: must be one of/],
    [['inspect', '--policy', policy, '--secrets', badSecrets, '-'], /must be a JSON array of strings/],
    [['inspect', '--policy', policy, '--phase', 'middle', '-'], /--phase.*middle/],
    [['inspect', '--policy', policy, join(dir, 'nobody.json')], /cannot read body .*ENOENT/],
    [['inspect', '--policy', policy, '--inspect-timeout', 'later', '-'], /inspect-timeout/],
  ];
  for (const [args, message] of cases) {
    const r = await runDvx(args, { stdin: '{}' });
    t.equal(r.code, 2, args.join(' '));
    t.match(r.stderr, message);
    t.notMatch(r.stderr, /\n\s+at /, 'no stack trace');
  }
});

t.test('bodies past 32 MB are a clear error; non-JSON and non-UTF-8 bodies are scanned as bytes', async (t) => {
  const big = await file('big.bin', Buffer.alloc(32 * 1024 * 1024 + 1, 0x61));
  const r = await runDvx(['inspect', '--policy', policy, big]);
  t.equal(r.code, 2);
  t.match(r.stderr, /exceeds the 33554432-byte \(32 MB\) limit/);
  const piped = await runDvx(['inspect', '--policy', policy, '-'], { stdin: Buffer.alloc(32 * 1024 * 1024 + 1, 0x61) });
  t.equal(piped.code, 2, 'the same limit on stdin');
  const binary = Buffer.concat([
    Buffer.from([0xff, 0xfe, 0x00, 0xc3]),
    Buffer.from(' contact bob@example.org \\u0040 nightingale '),
    Buffer.from([0x80, 0x81]),
  ]);
  const b = await runDvx(['inspect', '--policy', policy, '--phase', 'response', '-'], { stdin: binary });
  t.equal(b.code, 0);
  t.same(
    b.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).inspector_type),
    ['patterns'],
  );
  const pii = await runDvx(['inspect', '--policy', policy, '-'], { stdin: binary });
  t.equal(pii.code, 1, 'model allowlist: a non-JSON body has no model');
  t.match(pii.stdout, /"email address","match":"bob@\*\*\*\*"/);
});

t.test('sidecars run for real; a failing one fails open, or exit 3 is never caused by it', async (t) => {
  const withSidecars = await file(
    'sidecars.json',
    JSON.stringify({
      sidecar_inspection: {
        sidecars: [
          { name: 'judge', url: sidecars.url('/good'), on_request: true, severity: 'block' },
          { name: 'broken', url: sidecars.url('/error'), on_request: true },
        ],
      },
    }),
  );
  const r = await runDvx(
    [
      'inspect',
      '--policy',
      withSidecars,
      '--agent-id',
      '5',
      '--org-id',
      '9',
      '--agent-name',
      'ci',
      '--inspect-fail-closed',
      '-',
    ],
    { stdin: req('hello') },
  );
  t.equal(r.code, 1);
  t.match(JSON.parse(r.stdout), { inspector_type: 'sidecar:judge', severity: 'block', location: 'sidecar' });
  t.match(r.stderr, /inspection failopen/);
  t.match(sidecars.received.find((x) => x.path === '/good')!.body, {
    agent_id: 5,
    organization_id: 9,
    agent_name: 'ci',
    phase: 'request',
  });
});
