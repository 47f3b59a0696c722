import { mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { gunzip, gzipSync } from 'node:zlib';
import { performance } from 'node:perf_hooks';
import { pino } from 'pino';
import { createClient } from '@clickhouse/client';
import pg from 'pg';
import { newId } from '../core/ids.ts';
import { encodeFrame } from '../audit-wal/frame.ts';
import { openStore } from '../audit-wal/store.ts';
import { WalTable } from '../audit-wal/wal-table.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { formatMs, table } from './measure.ts';
import { p50p99 } from './stats.ts';

// npm run bench -- wal [--quick] [--appenders 1,16,256] [--rounds N] [--no-ship] [--against DIR] [--pool-load N]
// Durable records/s and append-to-durable p50/p99 for 1 KiB records at 1, 16 and 256 concurrent
// appenders: ours (group commit), the naive durable baseline (one write + fdatasync per record), and
// pino to a file without fsync (fast, not durable), and the disk itself as the floor: one write +
// fdatasync of a pre-encoded batch of as many records as there are appenders, back to back, with no
// JavaScript work between (what group commit could reach at best; a record's latency there is its
// batch's). Then shipping rates to ClickHouse and PostgreSQL.
// --rounds N runs ours N times per concurrency (a fresh table each) and reports the round with the
// median records/s: on a shared machine one round's p99 is often one stalled fdatasync.
// --no-ship leaves out the shipping table.
// --against DIR also runs the WalTable of another tree (`git archive <rev> audit-wal core | tar -x -C DIR`),
// its rounds interleaved with ours, as the row "before"; "vs ours" is then the A/B ratio.
// --pool-load N keeps N gunzips of a 1 MB body in flight on libuv's thread pool while ours and before
// run (what the proxy's body decoding does to the pool).

const RECORD = { id: '', event_time: '', org_id: 'org-1', agent_id: 'agent-1', pad: 'x'.repeat(900) };
const record = () => ({ ...RECORD, id: newId(), event_time: new Date().toISOString() });

interface Result {
  perSec: number;
  p50: number;
  p99: number;
  /** Process CPU (user + system, all threads) per record, µs: what the disk's stalls do not move. */
  cpuUs: number;
}

let poolLoad = 0;
let poolBusy = false;
const gzBody = gzipSync(Buffer.from(Array.from({ length: 40_000 }, (_, i) => `line ${i} ${i * 7919}`).join('\n')));
function gunzipLoop(): void {
  if (poolBusy) gunzip(gzBody, gunzipLoop);
}

async function drive(concurrency: number, total: number, append: () => Promise<void>): Promise<Result> {
  poolBusy = poolLoad > 0;
  for (let i = 0; i < poolLoad; i++) gunzipLoop();
  try {
    return await driveLoaded(concurrency, total, append);
  } finally {
    poolBusy = false;
  }
}

async function driveLoaded(concurrency: number, total: number, append: () => Promise<void>): Promise<Result> {
  const lat: number[] = [];
  let issued = 0;
  const started = performance.now();
  const cpu = process.cpuUsage();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (issued < total) {
        issued++;
        const t0 = performance.now();
        await append();
        lat.push(performance.now() - t0);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  return {
    perSec: lat.length / seconds,
    ...p50p99(lat),
    cpuUs: (used.user + used.system) / lat.length,
  };
}

/** Shipping: rows/s into each store, batches of 10,000. */
async function shippingRates(quick: boolean): Promise<string[][]> {
  const shipped: string[][] = [];
  const batch = Array.from({ length: 10_000 }, record);
  const targets: [string, string, () => Promise<void>][] = [];
  const chDb = `dvx_bench_${Date.now().toString(36)}`;
  targets.push([
    'ClickHouse (HTTP, JSONEachRow)',
    `clickhouse://default@127.0.0.1:8123/${chDb}`,
    async () => {
      const c = createClient({ url: 'http://127.0.0.1:8123' });
      await c.command({ query: `DROP DATABASE IF EXISTS ${chDb}` });
      await c.close();
    },
  ]);
  const pgDb = `dvx_bench_${Date.now().toString(36)}`;
  const admin = new pg.Client({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
  let pgUp = true;
  try {
    await admin.connect();
    await admin.query(`CREATE DATABASE ${pgDb}`);
  } catch {
    pgUp = false;
  }
  if (pgUp)
    targets.push([
      'PostgreSQL (json_populate_recordset)',
      `postgres://postgres@127.0.0.1:5432/${pgDb}`,
      async () => {
        await admin.query(`DROP DATABASE IF EXISTS ${pgDb} WITH (FORCE)`);
      },
    ]);
  for (const [name, dsn, cleanup] of targets) {
    try {
      const store = await openStore(dsn);
      await store.ensureSchema();
      const rounds = quick ? 2 : 5;
      const started = performance.now();
      for (let i = 0; i < rounds; i++)
        await store.insert(
          'llm_audit_log',
          batch.map((r) => ({ ...r, id: newId() })),
        );
      const perSec = (rounds * batch.length) / ((performance.now() - started) / 1000);
      await store.close();
      shipped.push([name, perSec.toFixed(0)]);
    } catch (err) {
      shipped.push([name, `unavailable (${(err as Error).message.slice(0, 60)})`]);
    } finally {
      await cleanup().catch(() => {});
    }
  }
  if (pgUp) await admin.end();
  return shipped;
}

/**
 * The disk's floor for a group commit of `batch` records: back-to-back write + fdatasync of one
 * pre-encoded buffer of `batch` frames, `total / batch` times; each record's latency is its batch's.
 */
async function diskFloor(path: string, batch: number, total: number): Promise<Result> {
  const frames = Buffer.concat(Array.from({ length: batch }, () => encodeFrame(Buffer.from(JSON.stringify(record())))));
  const file = await open(path, 'a');
  const lat: number[] = [];
  const batches = Math.max(1, Math.round(total / batch));
  const cpu = process.cpuUsage();
  const started = performance.now();
  try {
    for (let i = 0; i < batches; i++) {
      const t0 = performance.now();
      await file.write(frames);
      await file.datasync();
      const ms = performance.now() - t0;
      for (let r = 0; r < batch; r++) lat.push(ms);
    }
  } finally {
    await file.close();
  }
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  return { perSec: lat.length / seconds, ...p50p99(lat), cpuUs: (used.user + used.system) / lat.length };
}

function option(args: string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : undefined;
}

export async function main(args: string[]): Promise<void> {
  const quick = args.includes('--quick');
  const appenders = (option(args, '--appenders') ?? '1,16,256').split(',').map(Number);
  const rounds = Math.max(1, Number(option(args, '--rounds') ?? 1));
  const ship = !args.includes('--no-ship');
  const against = option(args, '--against');
  poolLoad = Number(option(args, '--pool-load') ?? 0);
  const Before: typeof WalTable | null = against
    ? (await import(pathToFileURL(join(resolve(against), 'audit-wal', 'wal-table.ts')).href)).WalTable
    : null;
  const dir = await mkdtemp(join(tmpdir(), 'dvx-walbench-'));
  const rows: string[][] = [];
  const totals: Record<number, number> = quick ? { 1: 300, 16: 3000, 256: 20000 } : { 1: 1000, 16: 10000, 256: 100000 };
  const total = (concurrency: number) => totals[concurrency] ?? Math.min(concurrency * 400, 100_000);
  try {
    for (const concurrency of appenders) {
      const runs: Result[] = [];
      const beforeRuns: Result[] = [];
      const round = async (Table: typeof WalTable, name: string, into: Result[]) => {
        const wal = await Table.open(join(dir, name), 'bench', { maxBytes: 4 * 1024 * 1024 * 1024 });
        into.push(await drive(concurrency, total(concurrency), () => wal.append(record())));
        await wal.close();
        await rm(join(dir, name), { recursive: true, force: true });
      };
      for (let r = 0; r < rounds; r++) {
        // Interleaved, the order alternating: both see the same machine.
        if (Before && r % 2 === 0) await round(Before, `before-${concurrency}-${r}`, beforeRuns);
        await round(WalTable, `ours-${concurrency}-${r}`, runs);
        if (Before && r % 2 === 1) await round(Before, `before-${concurrency}-${r}`, beforeRuns);
      }
      const median = (results: Result[]) => results.sort((a, b) => a.perSec - b.perSec)[Math.floor(results.length / 2)];
      const ours = median(runs);
      const before = Before ? median(beforeRuns) : null;

      const floor = await diskFloor(join(dir, `floor-${concurrency}.log`), concurrency, total(concurrency));

      const naiveFile = await open(join(dir, `naive-${concurrency}.log`), 'a');
      let chain = Promise.resolve();
      const naive = await drive(concurrency, quick ? 300 : 2000, () => {
        // One record, one write, one fdatasync, in order: the durable baseline without group commit.
        const frame = encodeFrame(Buffer.from(JSON.stringify(record())));
        const done = chain.then(async () => {
          await naiveFile.write(frame);
          await naiveFile.datasync();
        });
        chain = done;
        return done;
      });
      await naiveFile.close();

      const dest = pino.destination({ dest: join(dir, `pino-${concurrency}.log`), sync: false });
      await new Promise((r) => dest.once('ready', r));
      const logger = pino({ base: null }, dest);
      const fast = await drive(concurrency, total(concurrency), async () => {
        logger.info(record());
      });
      await new Promise<void>((r) => dest.flush(() => r()));

      for (const [name, r] of [
        ['ours: group commit (durable)', ours],
        ...(before ? ([[`before: ${against} (durable)`, before]] as const) : []),
        [`floor: the disk (write + fdatasync per batch of ${concurrency}, no JS)`, floor],
        ['baseline: fdatasync per record (durable)', naive],
        ['peer: pino to a file, no fsync (not durable)', fast],
      ] as const) {
        rows.push([
          String(concurrency),
          name,
          r.perSec.toFixed(0),
          formatMs(r.p50),
          formatMs(r.p99),
          r.cpuUs.toFixed(1),
          (r.perSec / ours.perSec).toFixed(2) + '×',
          r === floor ? '' : (r.p99 / floor.p99).toFixed(2) + '×',
        ]);
      }
    }

    const shipped = ship ? await shippingRates(quick) : [];

    process.stdout.write(
      [
        `## wal — ${conditions(`1 KiB records; WAL on ${tmpdir()}${poolLoad ? `; ${poolLoad} gunzips always in flight on the thread pool` : ''}; ${rounds} round(s) of ours${against ? ' and before, interleaved' : ''}, the median by records/s shown; vs ours = records/s / ours' at the same concurrency; p99 vs the disk = p99 / the floor's p99`, UNPINNED)}`,
        '',
        table(
          [
            'appenders',
            'contender',
            'records/s',
            'append→durable p50',
            'p99',
            'CPU µs/record',
            'vs ours',
            'p99 vs the disk',
          ],
          rows,
        ),
        '',
        ...(ship ? [table(['store', 'rows/s shipped (batches of 10,000)'], shipped), ''] : []),
      ].join('\n'),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
