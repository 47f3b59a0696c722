import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lockWalDir, WAL_LOCK_FILE } from '../../audit-wal/dir-lock.ts';
import { WalDirBusyError } from '../../audit-wal/errors.ts';
import { until } from '../fixtures/eventually.ts';

// One writer per WAL directory (audit-wal/dir-lock.ts), against real processes: a live holder in
// another process refuses the lock, a SIGKILLed one is taken over, and a reused pid is not mistaken
// for the holder.

const dir = await mkdtemp(join(tmpdir(), 'dvx-dir-lock-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

t.test('a live holder in another process refuses the lock; once it is SIGKILLed the lock is taken over', async (t) => {
  const spool = join(dir, 'a');
  const holder = spawn(
    process.execPath,
    [
      '-e',
      `import(${JSON.stringify(new URL('../../audit-wal/dir-lock.ts', import.meta.url).href)}).then(async (m) => { await m.lockWalDir(${JSON.stringify(spool)}); console.log('held'); setInterval(() => {}, 1000); });`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.teardown(() => holder.kill('SIGKILL'));
  let out = '';
  holder.stdout.on('data', (d) => (out += d));
  t.ok(await until(() => out.includes('held')), 'the other process holds it');
  await t.rejects(lockWalDir(spool), WalDirBusyError, 'refused while it lives');
  holder.kill('SIGKILL');
  await new Promise((r) => holder.once('exit', r));
  const release = await lockWalDir(spool);
  t.equal(JSON.parse(await readFile(join(spool, WAL_LOCK_FILE), 'utf8')).pid, process.pid, 'ours now');
  await t.rejects(lockWalDir(spool), WalDirBusyError, 'a second open in this process is refused too');
  await release();
  const again = await lockWalDir(spool);
  t.pass('released: taken again');
  await again();
});

t.test('a lock naming a live pid that started at another time is stale (pid reuse)', async (t) => {
  const spool = join(dir, 'b');
  const release0 = await lockWalDir(spool);
  const real = JSON.parse(await readFile(join(spool, WAL_LOCK_FILE), 'utf8')) as { pid: number; start: number | null };
  await release0();
  if (real.start === null) return t.plan(0, 'no /proc start times here');
  await writeFile(join(spool, WAL_LOCK_FILE), JSON.stringify({ pid: process.pid, start: real.start - 1 }));
  const release = await lockWalDir(spool);
  t.pass('taken over');
  await release();
});
