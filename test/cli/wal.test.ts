import t from 'tap';
import { mkdtemp, readdir, rm, open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WalTable } from '../../audit-wal/wal-table.ts';
import { runDvx } from '../fixtures/run-dvx.ts';

const dir = await mkdtemp(join(tmpdir(), 'dvx-walcli-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const table = await WalTable.open(join(dir, 'llm_audit_log'), 'llm_audit_log', { segmentBytes: 2048 });
for (let i = 0; i < 30; i++)
  await table.append({ id: `r${i}`, event_time: new Date(Date.now() - 60_000).toISOString(), pad: 'x'.repeat(80) });
const { next } = await table.read(table.checkpoint, 10);
await table.commit(next);

t.test('stat: segments, unshipped bytes, oldest unshipped age, dropped count, checkpoint', async (t) => {
  const small = await WalTable.open(join(dir, 'audit_events'), 'audit_events', { maxBytes: 200 });
  await Promise.allSettled(Array.from({ length: 5 }, () => small.append({ id: 'x', pad: 'y'.repeat(100) })));
  await small.close();
  const r = await runDvx(['wal', 'stat', '--dir', dir]);
  t.equal(r.code, 0, r.stderr);
  const lines = r.stdout
    .trim()
    .split('\n')
    .map((l: string) => JSON.parse(l));
  const s = lines.find((l: { table: string }) => l.table === 'llm_audit_log');
  t.match(s, { table: 'llm_audit_log', checkpoint: next });
  t.equal(s.unshipped_bytes, table.stats().unshippedBytes);
  t.ok(s.oldest_unshipped_age_s >= 59, `age ${s.oldest_unshipped_age_s}`);
  t.equal(s.dropped, 0);
  const events = lines.find((l: { table: string }) => l.table === 'audit_events');
  t.equal(events.dropped, 4, 'drops survive the process');
});

t.test('tail: unshipped records as JSON lines; --all from the start; --follow sees new appends', async (t) => {
  const r = await runDvx(['wal', 'tail', '--dir', dir, '--table', 'llm_audit_log']);
  t.same(
    r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).id),
    Array.from({ length: 20 }, (_, i) => `r${i + 10}`),
  );
  const all = await runDvx(['wal', 'tail', '--dir', dir, '--all']);
  t.ok(all.stdout.trim().split('\n').length >= 20);
  const { spawn } = await import('node:child_process');
  const { DVX_BIN } = await import('../fixtures/run-dvx.ts');
  const child = spawn(DVX_BIN, ['wal', 'tail', '--dir', dir, '--follow'], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  await new Promise((r) => setTimeout(r, 1500));
  await table.append({ id: 'live-one' });
  for (let i = 0; i < 40 && !out.includes('live-one'); i++) await new Promise((r) => setTimeout(r, 100));
  child.kill();
  t.match(out, /live-one/);
  t.equal((await runDvx(['wal', 'tail', '--dir', dir, '--table', 'nope'])).code, 2);
});

t.test('verify: exit 0 on a clean spool, 1 with offsets on corruption', async (t) => {
  t.equal((await runDvx(['wal', 'verify', '--dir', dir])).code, 0);
  const seg = join(
    dir,
    'llm_audit_log',
    (await readdir(join(dir, 'llm_audit_log'))).filter((f) => f.endsWith('.wal')).sort()[0],
  );
  const h = await open(seg, 'r+');
  await h.write(Buffer.from([0xff, 0xff]), 0, 2, 40);
  await h.close();
  const r = await runDvx(['wal', 'verify', '--dir', dir]);
  t.equal(r.code, 1);
  t.match(JSON.parse(r.stdout.trim().split('\n')[0]), {
    table: 'llm_audit_log',
    problem: /crc mismatch|torn|impossible/,
  });
  t.match(r.stderr, /problem/);
  t.equal((await runDvx(['wal', 'verify', '--dir', join(dir, 'missing')])).code, 2);
});

t.teardown(() => table.close());
