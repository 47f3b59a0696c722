import t from 'tap';
import fc from 'fast-check';
import { spawn, execFileSync } from 'node:child_process';
import { appendFile, mkdtemp, open, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger } from '../../core/logger.ts';
import { WalTable } from '../../audit-wal/wal-table.ts';
import { WalFullError, WalWriteError } from '../../audit-wal/errors.ts';
import { decodeFrames, encodeFrame, HEADER_BYTES, segmentHeader } from '../../audit-wal/frame.ts';

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'dvx-wal-'));
  dirs.push(d);
  return d;
}

async function readAll(table: WalTable): Promise<{ id: string }[]> {
  const out: { id: string }[] = [];
  let pos = table.checkpoint;
  for (;;) {
    const { records, next } = await table.read(pos, 1000);
    if (records.length === 0) return out;
    for (const r of records) out.push(JSON.parse(r.payload.toString()));
    pos = next;
  }
}

t.test('concurrent appends are group-committed, durable and read back in order', async (t) => {
  const dir = await tempDir();
  const table = await WalTable.open(dir, 'llm_audit_log');
  await Promise.all(Array.from({ length: 2000 }, (_, i) => table.append({ id: `r${i}` })));
  const records = await readAll(table);
  t.equal(records.length, 2000);
  t.same(
    records.slice(0, 3).map((r) => r.id),
    ['r0', 'r1', 'r2'],
  );
  await table.close();
  const again = await WalTable.open(dir, 'llm_audit_log');
  t.equal((await readAll(again)).length, 2000, 'still there after reopening');
  await again.append({ id: 'after' });
  t.equal((await readAll(again)).at(-1)!.id, 'after');
  await again.close();
});

t.test('segments rotate by size; commit moves the checkpoint and deletes shipped segments', async (t) => {
  const dir = await tempDir();
  const table = await WalTable.open(dir, 't', { segmentBytes: 4096 });
  for (let i = 0; i < 100; i++) await table.append({ id: `r${i}`, pad: 'x'.repeat(100) });
  t.ok(table.stats().segments > 3, `${table.stats().segments} segments`);
  const { records, next } = await table.read(table.checkpoint, 60);
  t.equal(records.length, 60);
  await table.commit(next);
  t.same(
    (await readAll(table)).map((r) => r.id),
    Array.from({ length: 40 }, (_, i) => `r${60 + i}`),
    'only the unshipped remain',
  );
  const files = (await readdir(dir)).filter((f) => f.endsWith('.wal'));
  t.equal(files.length, table.stats().segments, 'shipped segments deleted');
  await table.close();
  const reopened = await WalTable.open(dir, 't', { segmentBytes: 4096 });
  t.same(reopened.checkpoint, next, 'the checkpoint survives a restart');
  t.equal((await readAll(reopened)).length, 40);
  await reopened.close();
});

t.test('a torn or bit-flipped tail is cut at the first bad frame, with the offset logged', async (t) => {
  for (const damage of ['torn', 'flip', 'garbage'] as const) {
    const dir = await tempDir();
    const table = await WalTable.open(dir, 't');
    for (let i = 0; i < 10; i++) await table.append({ id: `r${i}` });
    await table.close();
    const seg = join(dir, (await readdir(dir)).find((f) => f.endsWith('.wal'))!);
    const size = (await stat(seg)).size;
    if (damage === 'torn') {
      const h = await open(seg, 'r+');
      await h.truncate(size - 3);
      await h.close();
    }
    if (damage === 'flip') {
      const h = await open(seg, 'r+');
      const b = Buffer.alloc(1);
      await h.read(b, 0, 1, size - 2);
      b[0] ^= 0x10;
      await h.write(b, 0, 1, size - 2);
      await h.close();
    }
    if (damage === 'garbage') await appendFile(seg, Buffer.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]));
    const lines: string[] = [];
    const reopened = await WalTable.open(dir, 't', {
      log: createLogger({ destination: { write: (s: string) => void lines.push(s) } }),
    });
    const ids = (await readAll(reopened)).map((r) => r.id);
    t.same(
      ids,
      damage === 'garbage'
        ? Array.from({ length: 10 }, (_, i) => `r${i}`)
        : Array.from({ length: 9 }, (_, i) => `r${i}`),
      `${damage}: everything before the damage`,
    );
    const cut = lines
      .map((l) => JSON.parse(l))
      .find((l) => l.msg === 'wal tail cut at the first torn or corrupt frame');
    t.ok(cut && Number.isInteger(cut.offset) && cut.offset > 0, `${damage}: logged with the offset (${cut?.offset})`);
    await reopened.append({ id: 'next' });
    t.equal((await readAll(reopened)).at(-1)!.id, 'next', `${damage}: appends continue after the cut`);
    await reopened.close();
  }
});

t.test('past the ceiling records are dropped and counted, without blocking', async (t) => {
  const dir = await tempDir();
  const lines: string[] = [];
  const table = await WalTable.open(dir, 't', {
    maxBytes: 2000,
    log: createLogger({ destination: { write: (s: string) => void lines.push(s) } }),
  });
  const results = await Promise.allSettled(
    Array.from({ length: 50 }, (_, i) => table.append({ id: `r${i}`, pad: 'x'.repeat(50) })),
  );
  const dropped = results.filter((r) => r.status === 'rejected');
  t.ok(dropped.length > 0 && dropped.every((r) => (r as PromiseRejectedResult).reason instanceof WalFullError));
  t.equal(table.stats().dropped, dropped.length);
  t.equal(lines.filter((l) => /wal full/.test(l)).length, 1, 'the log line is rate-limited');
  const { next } = await table.read(table.checkpoint, 1000);
  await table.commit(next);
  await t.resolves(table.append({ id: 'room-again' }), 'shipping makes room');
  await table.close();
});

const ROOT = process.getuid?.() === 0;
t.test('disk full (a real 64 KiB tmpfs): the append fails, what was acknowledged stays readable', async (t) => {
  if (!ROOT) {
    t.plan(0, 'needs root to mount a tmpfs');
    return;
  }
  const dir = await tempDir();
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', dir]);
  } catch (err) {
    t.plan(0, `cannot mount a tmpfs here: ${(err as Error).message}`);
    return;
  }
  t.teardown(() => execFileSync('umount', [dir]));
  const table = await WalTable.open(dir, 't', { maxBytes: 10 * 1024 * 1024 });
  let failed: unknown = null;
  let ok = 0;
  for (let i = 0; i < 200 && !failed; i++) {
    try {
      await table.append({ id: `r${i}`, pad: 'x'.repeat(1000) });
      ok++;
    } catch (err) {
      failed = err;
    }
  }
  t.ok(failed instanceof WalWriteError, 'ENOSPC surfaces as WalWriteError');
  t.ok(ok > 10, `${ok} records fit first`);
  t.equal((await readAll(table)).length, ok, 'every acknowledged record, nothing torn after them');
  await t.rejects(
    table.append({ id: 'still-full', pad: 'x'.repeat(4000) }),
    WalWriteError,
    'still refused while the disk is full',
  );
  await table.close();
  const reopened = await WalTable.open(dir, 't');
  t.equal((await readAll(reopened)).length, ok, 'and after a restart');
  await reopened.close();
});

t.test('SIGKILL while appending under load: every acknowledged record survives exactly once', async (t) => {
  const dir = await tempDir();
  const fixture = new URL('../fixtures/wal-appender.ts', import.meta.url).pathname;
  const acked = new Set<string>();
  for (let round = 0; round < 6; round++) {
    const child = spawn(process.execPath, [fixture, dir, `k${round}`], { stdio: ['ignore', 'pipe', 'inherit'] });
    let buffered = '';
    const { promise: firstAck, resolve } = Promise.withResolvers<void>();
    child.stdout.on('data', (d) => {
      buffered += d;
      const lines = buffered.split('\n');
      buffered = lines.pop()!;
      for (const l of lines) acked.add(l);
      resolve();
    });
    const closed = new Promise((r) => child.on('close', r));
    // Timed from the child's first acknowledged record, not its spawn: on a loaded machine starting
    // Node can take longer than the whole window, and a kill before any append tests nothing.
    await Promise.race([firstAck, closed]);
    await new Promise((r) => setTimeout(r, Math.random() * 600));
    child.kill('SIGKILL');
    await closed;
  }
  const table = await WalTable.open(dir, 'llm_audit_log', { segmentBytes: 256 * 1024 });
  const ids = (await readAll(table)).map((r) => r.id);
  const seen = new Set(ids);
  t.equal(seen.size, ids.length, 'no record twice');
  const missing = [...acked].filter((id) => !seen.has(id));
  t.same(missing, [], `all ${acked.size} acknowledged records present`);
  t.ok(acked.size > 100, `${acked.size} acknowledged across 6 kills`);
  await table.close();
});

t.test('property: any appends then a cut at any byte recover to a prefix of what was written', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.string({ maxLength: 60 }), { minLength: 1, maxLength: 30 }),
      fc.nat(),
      async (values, cutSeed) => {
        const frames = values.map((v) => encodeFrame(Buffer.from(JSON.stringify({ v }))));
        const file = Buffer.concat([segmentHeader(), ...frames]);
        const cut = HEADER_BYTES + (cutSeed % (file.length - HEADER_BYTES + 1));
        const dir = await mkdtemp(join(tmpdir(), 'dvx-walprop-'));
        try {
          await writeFile(join(dir, '000000000001.wal'), file.subarray(0, cut));
          const table = await WalTable.open(dir, 'p');
          const got = (await readAll(table)).map((r) => (r as unknown as { v: string }).v);
          await table.close();
          const whole = decodeFrames(file.subarray(0, cut), HEADER_BYTES).frames.length;
          return got.length === whole && got.every((v, i) => v === values[i]);
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      },
    ),
    { numRuns: 60 },
  );
});
