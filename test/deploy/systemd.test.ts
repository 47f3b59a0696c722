import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runDvx } from '../fixtures/run-dvx.ts';

// The systemd units, checked by systemd's own tool: `systemd-analyze verify` on each unit (any line it
// prints is a failure: an unknown or misspelt key is only a warning with exit 0), and `systemd-analyze
// security --offline` holding each to an exposure level of 2.0 or less. verify checks that ExecStart's
// binary exists, and the units name the installed path /opt/dvx/bin/dvx: each unit is verified as a
// copy whose ExecStart names this checkout's bin/dvx, nothing else changed (docs/decisions.md, "systemd
// units verified as copies"). systemd-analyze comes from Debian's systemd package (.ci/run installs it);
// without it this test fails, it never skips.

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const UNITS = join(ROOT, 'deploy/systemd');
const COMPONENTS = ['controlplane', 'broker', 'llmproxy', 'gateway', 'imds'] as const;
const INSTALLED = '/opt/dvx/bin/dvx';

const analyze = spawnSync('systemd-analyze', ['--version'], { encoding: 'utf8' });
const haveAnalyze = analyze.status === 0;

/** The unit's settings: key → every value it is given, in order (a key may repeat). */
function parseUnit(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let section = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#') || line.startsWith(';')) continue;
    const s = /^\[(\w+)\]$/.exec(line);
    if (s) {
      section = s[1];
      continue;
    }
    const eq = line.indexOf('=');
    const key = `${section}.${line.slice(0, eq)}`;
    out.set(key, [...(out.get(key) ?? []), line.slice(eq + 1)]);
  }
  return out;
}

const REQUIRED: Record<string, string> = {
  'Service.User': 'dvx',
  'Service.NoNewPrivileges': 'yes',
  'Service.ProtectSystem': 'strict',
  'Service.ProtectHome': 'yes',
  'Service.PrivateTmp': 'yes',
  'Service.PrivateDevices': 'yes',
  'Service.CapabilityBoundingSet': '',
  'Service.AmbientCapabilities': '',
  'Service.SystemCallArchitectures': 'native',
  'Service.RestrictNamespaces': 'yes',
  'Service.RestrictSUIDSGID': 'yes',
  'Service.LockPersonality': 'yes',
  'Service.ProtectKernelTunables': 'yes',
  'Service.ProtectKernelModules': 'yes',
  'Service.ProtectControlGroups': 'yes',
  'Service.UMask': '0077',
};

async function verifyCopy(dir: string, name: string, text: string) {
  const path = join(dir, name);
  await writeFile(path, text.replaceAll(`ExecStart=${INSTALLED}`, `ExecStart=${join(ROOT, 'bin/dvx')}`));
  return spawnSync('systemd-analyze', ['verify', '--man=no', path], { encoding: 'utf8' });
}

t.test('systemd-analyze is installed (Debian: systemd)', async (t) => {
  t.ok(
    haveAnalyze,
    `systemd-analyze must be on the PATH to verify the units (apt-get install systemd): ${analyze.error?.message ?? analyze.stderr}`,
  );
});

for (const c of COMPONENTS) {
  t.test(`dvx-${c}.service`, { skip: !haveAnalyze && 'systemd-analyze is missing (failed above)' }, async (t) => {
    const text = readFileSync(join(UNITS, `dvx-${c}.service`), 'utf8');
    const unit = parseUnit(text);
    t.same(unit.get('Service.ExecStart'), [`${INSTALLED} serve ${c}`], 'runs the component from the installed path');
    t.same(unit.get('Service.EnvironmentFile'), [`/etc/dvx/${c}.env`], 'its DVX_* flags come from /etc/dvx');
    for (const [key, value] of Object.entries(REQUIRED)) t.same(unit.get(key), [value], `${key}=${value}`);
    t.same(unit.get('Service.SystemCallFilter'), ['@system-service', '~@privileged'], 'system calls: @system-service');
    t.ok(
      (unit.get('Service.RestrictAddressFamilies')?.[0] ?? '')
        .split(' ')
        .every((f) => ['AF_UNIX', 'AF_INET', 'AF_INET6'].includes(f)),
      'address families: unix and IP only',
    );
    t.ok(unit.get('Service.StateDirectory')?.[0]?.startsWith('dvx'), 'a StateDirectory under /var/lib/dvx');
    t.ok(unit.get('Service.RuntimeDirectory')?.[0]?.startsWith('dvx'), 'a RuntimeDirectory under /run');
    t.notOk(unit.has('Service.MemoryDenyWriteExecute'), "no MemoryDenyWriteExecute: V8's JIT needs it off");
    if (c === 'imds') t.same(unit.get('Service.Group'), ['dvx-agent'], "imds's socket group is the agent's");
    else t.same(unit.get('Service.LoadCredential')?.length, 2, 'the TLS pair comes in as credentials');

    const dir = await mkdtemp(join(tmpdir(), 'dvx-systemd-'));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const verify = await verifyCopy(dir, `dvx-${c}.service`, text);
    t.equal(verify.status, 0, 'systemd-analyze verify exits 0');
    t.equal(`${verify.stdout}${verify.stderr}`.trim(), '', 'and prints nothing (no warning)');
    const security = spawnSync(
      'systemd-analyze',
      ['security', '--offline=yes', '--threshold=20', '--no-pager', join(dir, `dvx-${c}.service`)],
      { encoding: 'utf8' },
    );
    const level = /Overall exposure level for [^:]+: ([\d.]+)/.exec(security.stdout)?.[1];
    t.equal(security.status, 0, `exposure ${level} is at most 2.0`);
  });

  t.test(`env/${c}.env names only variables of dvx serve ${c}`, async (t) => {
    const help = await runDvx(['serve', c, '--help']);
    t.equal(help.code, 0);
    const known = new Set(help.stdout.match(/DVX_[A-Z0-9_]+/g));
    const env = readFileSync(join(UNITS, 'env', `${c}.env`), 'utf8');
    const keys = env
      .split('\n')
      .filter((l) => l && !l.startsWith('#'))
      .map((l) => l.slice(0, l.indexOf('=')));
    t.ok(keys.length > 3, 'variables given');
    for (const k of keys) t.ok(known.has(k), `${k} is a flag of dvx serve ${c}`);
    t.notMatch(env, /=\s*(sk-|-----BEGIN|ey[A-Za-z0-9_-]{10,}\.)/, 'no key, token or PEM inline: secrets are files');
    t.notMatch(env, /:\/\/[^@\s/]+:[^@\s/]+@/, 'no password in a DSN');
  });
}

t.test(
  'verify is no rubber stamp: a misspelt hardening key and a missing binary fail',
  { skip: !haveAnalyze },
  async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'dvx-systemd-bad-'));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const text = readFileSync(join(UNITS, 'dvx-gateway.service'), 'utf8');
    const typo = await verifyCopy(dir, 'typo.service', text.replace('ProtectSystem=strict', 'ProtectSytem=strict'));
    t.match(`${typo.stdout}${typo.stderr}`, /Unknown key 'ProtectSytem'/, 'a misspelt key is reported');
    const missing = await verifyCopy(
      dir,
      'missing.service',
      text.replace(`ExecStart=${INSTALLED}`, 'ExecStart=/nonexistent/dvx'),
    );
    t.not(missing.status, 0, 'a binary that does not exist fails');
    const weak = await verifyCopy(
      dir,
      'weak.service',
      text.replace(
        /^(ProtectSystem|ProtectHome|PrivateDevices|CapabilityBoundingSet|SystemCallFilter|RestrictAddressFamilies|PrivateTmp|NoNewPrivileges)=.*\n/gm,
        '',
      ),
    );
    t.equal(weak.status, 0, 'an unhardened unit still verifies');
    const security = spawnSync(
      'systemd-analyze',
      ['security', '--offline=yes', '--threshold=20', join(dir, 'weak.service')],
      {
        encoding: 'utf8',
      },
    );
    t.not(security.status, 0, 'but its exposure is over 2.0');
  },
);

t.test('sysusers.d creates the dvx user and the agent group', async (t) => {
  const conf = readFileSync(join(UNITS, 'sysusers.d/dvx.conf'), 'utf8');
  t.match(conf, /^u dvx /m);
  t.match(conf, /^g dvx-agent /m);
  t.match(conf, /^m dvx dvx-agent$/m, 'dvx is in the agent group (imds creates the socket with it)');
});
