import t from 'tap';
import { spawn } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';
import { tlsDir } from '../fixtures/tls-dir.ts';

// `dvx serve controlplane` that cannot start exits 2 with the error, whatever it opened before: with a
// store, its pool and its LISTEN connection (and with --audit-dsn the WAL's shipper) kept the process up
// with nothing listening, so a supervisor saw it running. controlplane/server.ts closes what it opened.

t.test('a control plane that cannot start exits 2, whatever it opened', async (t) => {
  const db = await freshPgDatabase('dvx_cp_start_failure');
  if (!db) {
    if (process.env.CI) t.fail('PostgreSQL is not running on 127.0.0.1:5432');
    return t.plan(0, 'PostgreSQL not reachable');
  }
  const tls = await tlsDir('dvx-cp-start-failure-');
  const held = createServer().listen(0, '127.0.0.1');
  await new Promise((r) => held.once('listening', r));
  t.teardown(async () => {
    held.close();
    await tls.remove();
    await db.drop();
  });
  const port = (held.address() as AddressInfo).port;
  const base = [
    '--tls-cert',
    tls.cert,
    '--tls-key',
    tls.key,
    '--oidc-issuer',
    'https://127.0.0.1:1',
    '--database-dsn',
    db.dsn,
  ];
  const wal = ['--audit-dsn', 'postgres://nobody@127.0.0.1:1/none', '--audit-wal-dir', `${tls.dir}/wal`];
  const cases: [string, string[], RegExp][] = [
    ['the port in use, stdout audit', ['--addr', `127.0.0.1:${port}`], /listen EADDRINUSE/],
    ['the port in use, with a WAL', ['--addr', `127.0.0.1:${port}`, ...wal], /listen EADDRINUSE/],
    ['the metrics port in use', ['--addr', '127.0.0.1:0', '--metrics-addr', `127.0.0.1:${port}`], /listen EADDRINUSE/],
    [
      'an audit DSN it cannot ship to, after the store migrated',
      ['--addr', '127.0.0.1:0', '--audit-dsn', 'http://127.0.0.1:1', '--audit-wal-dir', `${tls.dir}/wal2`],
      /--audit-dsn scheme "http:" is not supported/,
    ],
  ];
  for (const [name, extra, error] of cases) {
    const { code, stderr, timedOut } = await runDvx(['serve', 'controlplane', ...base, ...extra], {
      timeoutMs: 30_000,
    });
    t.equal(timedOut ? 'still running after 30 s' : code, 2, `${name}: exits 2`);
    t.match(stderr, /controlplane failed to start: /, `${name}: says it failed to start`);
    t.match(stderr, error, `${name}: says why`);
  }
  // The store is left usable: a control plane on a free port starts on it and answers.
  const ok = spawn(DVX_BIN, ['serve', 'controlplane', ...base, '--addr', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => void ok.kill('SIGKILL'));
  let out = '';
  const listening = await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), 30_000);
    ok.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('controlplane listening')) {
        clearTimeout(timer);
        resolve(true);
      }
    });
    ok.on('exit', () => resolve(false));
  });
  t.ok(listening, 'a start on a free port over the same store listens');
  ok.kill('SIGTERM');
  await new Promise((r) => ok.once('exit', r));
});
