import t from 'tap';
import fc from 'fast-check';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WalTable, type WalMetrics } from '../../audit-wal/wal-table.ts';
import { WalWriteError } from '../../audit-wal/errors.ts';
import {
  decodeFrames,
  encodeJsonFrame,
  encodeJsonFrames,
  FRAME_OVERHEAD,
  HEADER_BYTES,
  MAX_RECORD_BYTES,
} from '../../audit-wal/frame.ts';

// The append path encodes a group commit once (one Buffer, one write, one fdatasync) and settles its
// appenders together. These tests hold it to the same on-disk format and the same durability.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'dvx-walbatch-'));
  dirs.push(d);
  return d;
}

async function readAll(table: WalTable): Promise<unknown[]> {
  const out: unknown[] = [];
  let pos = table.checkpoint;
  for (;;) {
    const { records, next } = await table.read(pos, 1000);
    if (records.length === 0) return out;
    for (const r of records) out.push(JSON.parse(r.payload.toString('utf8')));
    pos = next;
  }
}

/** Counts the table's writes: `unshipped` is reported once per durable write (and once on open). */
function countingMetrics(): WalMetrics & { writes: number; durables: number } {
  const m = {
    writes: 0,
    durables: 0,
    appended() {},
    durable() {
      m.durables++;
    },
    dropped() {},
    segments() {},
    unshipped() {
      m.writes++;
    },
  };
  return m;
}

t.test('property: a batch encodes byte for byte as its records framed one by one (format unchanged)', async () => {
  fc.assert(
    fc.property(fc.array(fc.string({ unit: 'grapheme', maxLength: 80 }), { maxLength: 40 }), (values) => {
      const jsons = values.map((v) => JSON.stringify({ v }));
      const lengths = jsons.map((j) => Buffer.byteLength(j));
      const bytes = lengths.reduce((a, b) => a + b + FRAME_OVERHEAD, 0);
      const batch = encodeJsonFrames(jsons, lengths, bytes);
      const decoded = decodeFrames(batch, 0);
      return (
        batch.equals(Buffer.concat(jsons.map(encodeJsonFrame))) &&
        decoded.problem === null &&
        decoded.frames.every((f, i) => f.payload.toString('utf8') === jsons[i])
      );
    }),
    { numRuns: 300 },
  );
});

t.test('appends made in one turn are one write, settled together, and durable', async (t) => {
  const dir = await tempDir();
  const metrics = countingMetrics();
  const table = await WalTable.open(dir, 't', { metrics });
  const opened = metrics.writes;
  const records = Array.from({ length: 500 }, (_, i) => ({ id: `r${i}`, text: `é — 漢字 — 🙂 ${i}` }));
  const settled: number[] = [];
  await Promise.all(records.map((r, i) => table.append(r).then(() => settled.push(i))));
  t.equal(metrics.writes - opened, 1, 'one write for the 500 appends of one turn');
  t.equal(settled.length, 500, 'every appender settled');
  t.equal(metrics.durables, 500, 'each record observed in the append-to-durable histogram');
  const segment = join(dir, (await readdir(dir)).find((f) => f.endsWith('.wal'))!);
  const expected = records.reduce((n, r) => n + FRAME_OVERHEAD + Buffer.byteLength(JSON.stringify(r)), HEADER_BYTES);
  t.equal((await stat(segment)).size, expected, 'the file holds exactly the frames (UTF-8 byte lengths, not chars)');
  await table.close();
  const reopened = await WalTable.open(dir, 't');
  t.same(await readAll(reopened), records, 'read back in order, multi-byte text intact, after reopening');
  await reopened.close();
});

t.test('appends arriving while a batch is on disk form the next batch, across segment rotation', async (t) => {
  const dir = await tempDir();
  const table = await WalTable.open(dir, 't', { segmentBytes: 2048 });
  const all: Promise<void>[] = [];
  const expected: unknown[] = [];
  for (let wave = 0; wave < 20; wave++) {
    for (let i = 0; i < 25; i++) {
      const r = { id: `w${wave}-${i}`, pad: 'ü'.repeat(10 + ((wave * 25 + i) % 90)) };
      expected.push(r);
      all.push(table.append(r));
    }
    // Waves a moment apart: some land while a write is in flight, and form the batch after it.
    await new Promise((r) => setTimeout(r, 1));
  }
  await Promise.all(all);
  t.ok(table.stats().segments > 2, `${table.stats().segments} segments`);
  await table.close();
  const reopened = await WalTable.open(dir, 't', { segmentBytes: 2048 });
  t.same(await readAll(reopened), expected, 'every record once, in append order');
  await reopened.close();
});

t.test('a record over the limit in UTF-8 bytes is refused alone; its batch-mates are durable', async (t) => {
  const dir = await tempDir();
  const table = await WalTable.open(dir, 't');
  // Fewer UTF-16 units than the limit, more bytes: the check is on bytes.
  const huge = '€'.repeat(Math.floor(MAX_RECORD_BYTES / 3) + 10);
  t.ok(huge.length < MAX_RECORD_BYTES);
  const results = await Promise.allSettled([
    table.append({ id: 'before' }),
    table.append({ id: 'huge', huge }),
    table.append({ id: 'after' }),
  ]);
  t.equal(results[0].status, 'fulfilled');
  t.ok(results[1].status === 'rejected' && results[1].reason instanceof WalWriteError, 'the large one refused');
  t.equal(results[2].status, 'fulfilled');
  t.same(
    (await readAll(table)).map((r) => (r as { id: string }).id),
    ['before', 'after'],
  );
  await table.close();
});

t.test('disk full under concurrent appends: a failed batch rejects each of its appenders, nothing torn', async (t) => {
  if (process.getuid?.() !== 0) {
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
  const acknowledged: string[] = [];
  let refused = 0;
  // Waves of concurrent appends, each wave one or two batches, until the 64 KiB disk is full.
  for (let wave = 0; wave < 40; wave++) {
    const ids = Array.from({ length: 8 }, (_, i) => `w${wave}-${i}`);
    const results = await Promise.allSettled(ids.map((id) => table.append({ id, pad: 'x'.repeat(1000) })));
    results.forEach((r, i) => {
      if (r.status === 'fulfilled') acknowledged.push(ids[i]);
      else {
        t.ok(r.reason instanceof WalWriteError, `${ids[i]} refused with WalWriteError`);
        refused++;
      }
    });
  }
  t.ok(refused >= 8, `${refused} appends refused once the disk filled`);
  t.ok(acknowledged.length > 10, `${acknowledged.length} acknowledged first`);
  t.same(
    (await readAll(table)).map((r) => (r as { id: string }).id),
    acknowledged,
    'exactly the acknowledged records, nothing torn after them',
  );
  await table.close();
  const reopened = await WalTable.open(dir, 't');
  t.same(
    (await readAll(reopened)).map((r) => (r as { id: string }).id),
    acknowledged,
    'and after a restart',
  );
  await reopened.close();
});
