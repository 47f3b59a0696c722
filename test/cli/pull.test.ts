import t from 'tap';
import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';

// The real `dvx policy-pull`, `dvx config-pull` and `dvx wait-file` processes against a control plane,
// and the control plane's own --policy-publish / --config-publish.
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
const reg = await h.call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-1', owning_org: 'org-a' });
await writeFile(join(h.dir, 'broker-key.json'), JSON.stringify(reg.body.key));
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1' });
await h.call('root', 'POST', '/config/region?scope=org&org=org-a', { value: 'eu' });
await h.call('root', 'POST', '/config/api.token?scope=org&org=org-a', { secret: true });
const base = `https://127.0.0.1:${h.cp.port}`;

function sidecar(args: string[]) {
  const child = spawn(DVX_BIN, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, DVX_LOG_LEVEL: 'warn' },
  });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
  return { child, exited, stderr: () => stderr };
}

t.test('policy-pull and config-pull write their files; wait-file sees them; SIGTERM stops cleanly', async (t) => {
  const snapshot = join(h.dir, 'policy.json');
  const config = join(h.dir, 'config.json');
  const policy = sidecar([
    'policy-pull',
    '--controlplane',
    base,
    '--broker-key',
    join(h.dir, 'broker-key.json'),
    '--snapshot',
    snapshot,
    '--insecure-skip-verify',
    '--interval',
    '30s',
  ]);
  const cfg = sidecar([
    'config-pull',
    '--controlplane',
    base,
    '--broker-key',
    join(h.dir, 'broker-key.json'),
    '--snapshot',
    config,
    '--insecure-skip-verify',
    '--no-events',
    '--interval',
    '1s',
  ]);
  t.equal((await runDvx(['wait-file', '--path', snapshot, '--poll', '100ms', '--timeout', '20s'])).code, 0);
  t.equal((await runDvx(['wait-file', '--path', config, '--poll', '100ms', '--timeout', '20s'])).code, 0);
  const snap = validateSnapshot(JSON.parse(await readFile(snapshot, 'utf8')));
  t.same(Object.keys(snap.agents), ['bot-1']);
  const values = JSON.parse(await readFile(config, 'utf8'));
  t.same(
    values.orgs['org-a'].config,
    {
      region: { value: 'eu', locked: false, secret: false },
      'api.token': { value: null, locked: false, secret: true },
    },
    'a secret key carries no value',
  );
  // A nudge re-pulls the policy puller at once.
  await h.call('root', 'PUT', '/platform/config/llmproxy/credential_mode', { value: JSON.stringify('passthrough') });
  let seen = false;
  for (let i = 0; i < 100 && !seen; i++) {
    seen = JSON.parse(await readFile(snapshot, 'utf8')).platform.credential_mode?.value === 'passthrough';
    if (!seen) await new Promise((r) => setTimeout(r, 50));
  }
  t.ok(seen, 'the snapshot followed the write');
  policy.child.kill('SIGTERM');
  cfg.child.kill('SIGTERM');
  t.equal(await policy.exited, 0, policy.stderr());
  t.equal(await cfg.exited, 0, cfg.stderr());
});

t.test('bad usage and timeouts', async (t) => {
  const missing = await runDvx(['policy-pull', '--controlplane', base]);
  t.equal(missing.code, 2);
  t.match(missing.stderr, /--broker-key is required/);
  const badKey = await runDvx([
    'policy-pull',
    '--controlplane',
    base,
    '--broker-key',
    join(h.dir, 'nope.json'),
    '--snapshot',
    join(h.dir, 'x.json'),
  ]);
  t.equal(badKey.code, 2);
  t.match(badKey.stderr, /cannot read --broker-key/);
  const late = await runDvx(['wait-file', '--path', join(h.dir, 'never'), '--poll', '50ms', '--timeout', '200ms']);
  t.equal(late.code, 1);
  t.match(late.stderr, /did not appear/);
});

t.test('--policy-publish and --config-publish write for a co-located enclave', async (t) => {
  const dir = join(h.dir, 'published');
  t.match(
    ((await h.start({ policyPublish: true }).catch((e: Error) => e)) as Error).message,
    /--policy-publish needs --policy-publish-dir and --policy-enclave-id/,
  );
  const cp = await h.start({
    seedAdmin: ['root'],
    policyPublish: true,
    policyPublishDir: dir,
    policyEnclaveId: 'enc-9',
    configPublish: true,
    configPublishDir: dir,
    configEnclaveId: 'enc-9',
  });
  t.teardown(() => cp.close());
  await h.callAt(cp.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  await h.callAt(cp.port, 'root', 'POST', '/enclaves', { name: 'local', enclave_id: 'enc-9', owning_org: 'org-a' });
  await h.callAt(cp.port, 'root', 'PUT', '/platform/config/llmproxy/credential_mode', {
    value: JSON.stringify('passthrough'),
  });
  await h.callAt(cp.port, 'root', 'POST', '/config/region', { value: 'eu' });
  let policy: { platform?: { credential_mode?: { value: string } } } = {};
  let config: { platform?: { region?: { value: string } } } = {};
  for (let i = 0; i < 100; i++) {
    policy = JSON.parse(await readFile(join(dir, 'policy-snapshot.json'), 'utf8').catch(() => '{}'));
    config = JSON.parse(await readFile(join(dir, 'config.json'), 'utf8').catch(() => '{}'));
    if (policy.platform?.credential_mode && config.platform?.region) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  t.equal(policy.platform?.credential_mode?.value, 'passthrough');
  t.equal(config.platform?.region?.value, 'eu');
  validateSnapshot(policy);
});
