import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WalTable } from '../../audit-wal/wal-table.ts';

// kill -9 of a real appending process at random moments, restarted on the same directory each time
// (its open repairs what the kill left). Beyond "every acknowledged record survives": what is read back
// is exactly, in order, a gap-free prefix of each run's appends, every record whole. Group commit writes
// batches in append order and a torn batch is cut on open, so a record after a gap, a record out of
// order or a damaged payload would each be a durability bug the weaker check does not see.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));

const fixture = new URL('../fixtures/wal-appender.ts', import.meta.url).pathname;
// The fixture appends `${prefix}-${k}` with a pad of 200 + ((k + 1) % 700) 'x' (its counter is
// incremented before the pad is built), 64 appends in flight, and prints each id once durable.
const padOf = (k: number) => 200 + ((k + 1) % 700);

interface Run {
  prefix: string;
  acked: Set<string>;
}

/**
 * Runs the appender on `dir` and kills it with SIGKILL: `afterAck` ms after its first acknowledged
 * record (mid-append), or, with `afterAck` null, `early` ms after spawning it, whatever it is doing then
 * (starting, repairing the tail the previous kill left, or appending).
 */
async function killAt(dir: string, prefix: string, when: { afterAck: number } | { early: number }): Promise<Run> {
  const run: Run = { prefix, acked: new Set() };
  const child = spawn(process.execPath, [fixture, dir, prefix], { stdio: ['ignore', 'pipe', 'inherit'] });
  const { promise: firstAck, resolve } = Promise.withResolvers<void>();
  let buffered = '';
  child.stdout.on('data', (d) => {
    buffered += d;
    const lines = buffered.split('\n');
    buffered = lines.pop()!;
    for (const l of lines) run.acked.add(l);
    if (run.acked.size > 0) resolve();
  });
  const closed = new Promise((r) => child.on('close', r));
  if ('early' in when) await new Promise((r) => setTimeout(r, when.early));
  else {
    await Promise.race([firstAck, closed]);
    await new Promise((r) => setTimeout(r, when.afterAck));
  }
  child.kill('SIGKILL');
  await closed;
  return run;
}

t.test('kill -9 at random points: each run leaves a whole, ordered, gap-free prefix of its appends', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-walkill-'));
  dirs.push(dir);
  const runs: Run[] = [];
  // Most kills land mid-append; every third at a random moment from spawn, which may be while the child
  // is starting or repairing the tail the previous kill left.
  for (let i = 0; i < 9; i++) {
    const random = Math.floor(Math.random() * 400);
    runs.push(await killAt(dir, `run${i}`, i % 3 === 2 ? { early: random } : { afterAck: random }));
  }

  const table = await WalTable.open(dir, 'llm_audit_log', { segmentBytes: 256 * 1024 });
  const read: { id: string; pad: string }[] = [];
  for (let pos = table.checkpoint; ; ) {
    const { records, next } = await table.read(pos, 1000);
    if (records.length === 0) break;
    for (const r of records) read.push(JSON.parse(r.payload.toString('utf8')));
    pos = next;
  }
  await table.close();

  // The expected log: for each run in turn, its records 0..n-1 where n is how many of them were read.
  const counts = new Map<string, number>();
  for (const r of read) {
    const prefix = r.id.slice(0, r.id.lastIndexOf('-'));
    counts.set(prefix, (counts.get(prefix) ?? 0) + 1);
  }
  const expected: string[] = [];
  for (const run of runs) for (let k = 0; k < (counts.get(run.prefix) ?? 0); k++) expected.push(`${run.prefix}-${k}`);
  t.same(
    read.map((r) => r.id),
    expected,
    'runs in order, each a gap-free prefix of its appends',
  );
  const damaged = read.filter((r) => r.pad !== 'x'.repeat(padOf(Number(r.id.slice(r.id.lastIndexOf('-') + 1)))));
  t.same(damaged, [], 'every record whole');
  const present = new Set(read.map((r) => r.id));
  for (const run of runs) {
    const missing = [...run.acked].filter((id) => !present.has(id));
    t.same(missing, [], `${run.prefix}: all ${run.acked.size} acknowledged records present`);
  }
  const acked = runs.reduce((n, r) => n + r.acked.size, 0);
  t.ok(acked > 100, `${acked} acknowledged across ${runs.length} kills`);
});
