import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { serveArgs, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';

// `dvx serve llmproxy` on a port another socket holds exits 2 with the error, whatever it opened
// before its listener (the WAL and its shipper kept the process up with nothing listening: an operator's
// supervisor saw it running). proxy/llm/server.ts closes what it opened when a listener cannot start.

t.test('a port in use: the process exits 2 with the error, with a WAL and without', async (t) => {
  const h = await startHarness();
  const dir = await mkdtemp(join(tmpdir(), 'dvx-start-failure-'));
  const held = createServer().listen(0, '127.0.0.1');
  await new Promise((r) => held.once('listening', r));
  t.teardown(async () => {
    held.close();
    await h.close();
    await rm(dir, { recursive: true, force: true });
  });
  const port = (held.address() as AddressInfo).port;
  const wal = ['--audit-dsn', 'postgres://nobody@127.0.0.1:1/none', '--audit-wal-dir', join(dir, 'wal')];
  // (Without --workers, a WAL runs one worker per core: the primary reports the worker's failure.)
  for (const extra of [[], wal, [...wal, '--workers', '1'], ['--metrics-addr', `127.0.0.1:${port}`]]) {
    const addr = extra.includes('--metrics-addr') ? '127.0.0.1:0' : `127.0.0.1:${port}`;
    const { code, stderr, timedOut } = await runDvx(serveArgs(h.dir, addr, extra), { timeoutMs: 30_000 });
    t.equal(timedOut ? 'still running after 30 s' : code, 2, `${extra.join(' ') || 'stdout audit'}: exits 2`);
    t.match(stderr, /llmproxy failed to start: (listen|bind) EADDRINUSE/);
  }
});
