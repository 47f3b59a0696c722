import t from 'tap';
import { mkdir, mkdtemp, rename, rm, rmdir, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { newId } from '../../core/ids.ts';
import { encodeFrame, encodeJsonFrame, segmentHeader } from '../../audit-wal/frame.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { startTcpProxy } from '../fixtures/tcp-proxy.ts';
import { runDvx } from '../fixtures/run-dvx.ts';
import { until, metric } from '../fixtures/eventually.ts';

// Each step of shipping made to fail for real, one after the other, in one running sink: records on
// disk that are not JSON objects, a segment that cannot be read, a checkpoint that cannot be written,
// a store that is cut off, a dead-letter spool that cannot be written. Each failure is logged with its
// error, counted by step, and nothing becomes an unhandled rejection; shipping resumes once the fault
// is gone, and nothing is lost or stored twice.

const rejections: unknown[] = [];
const onRejection = (reason: unknown) => rejections.push(reason);
process.on('unhandledRejection', onRejection);
t.teardown(() => void process.off('unhandledRejection', onRejection));

const record = (extra: Record<string, unknown> = {}) => ({
  id: newId(),
  event_time: new Date().toISOString(),
  org_id: 'org-1',
  agent_id: 'agent-1',
  agent_name: 'a',
  enclave_id: 'e',
  format: 'anthropic-messages',
  path: '/v1/messages',
  model: 'claude',
  status: 200,
  latency_ms: 1,
  request_bytes: 1,
  response_bytes: 1,
  decision: 'allow',
  findings: [],
  inspection_failopen: false,
  ...extra,
});

t.test('every step of shipping fails for real and shipping goes on', async (t) => {
  const pgdb = await freshPgDatabase('dvx_faults');
  if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
  t.teardown(pgdb.drop);
  const relay = await startTcpProxy(5432);
  t.teardown(() => relay.close());
  const dir = await mkdtemp(join(tmpdir(), 'dvx-faults-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const tableDir = join(dir, 'llm_audit_log');
  const segment = join(tableDir, '000000000001.wal');

  // On disk before the sink opens: well-framed (crc-checked) records that are not JSON, or JSON but
  // not an object, between good ones.
  const before = [record(), record()];
  await mkdir(tableDir, { recursive: true });
  await writeFile(
    segment,
    Buffer.concat([
      segmentHeader(),
      encodeJsonFrame(JSON.stringify(before[0])),
      encodeFrame(Buffer.from('{"id":"torn', 'utf8')),
      encodeFrame(Buffer.from('42', 'utf8')),
      encodeFrame(Buffer.from('[{"id":"in-an-array"}]', 'utf8')),
      encodeJsonFrame(JSON.stringify(before[1])),
    ]),
  );

  const lines: Record<string, unknown>[] = [];
  const log = createLogger({
    level: 'warn',
    destination: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) },
  });
  const registry = createRegistry();
  const dsn = pgdb.dsn.replace('127.0.0.1:5432', `127.0.0.1:${relay.port}`);
  const sink = await WalSink.open({
    dir,
    dsn,
    log,
    registry,
    tables: ['llm_audit_log'],
    shipper: { idleMs: 50, batchRows: 100, backoffMs: { base: 20, max: 100 } },
  });
  t.teardown(() => sink.close());
  const wal = sink.table('llm_audit_log')!;
  const shipped = () => wal.stats().unshippedBytes === 0;
  const failures = (reason: string) =>
    metric(registry, 'dvx_audit_ship_failures_total', { table: 'llm_audit_log', reason });
  const appendSome = (n: number, extra: Record<string, unknown> = {}) =>
    Promise.all(
      Array.from({ length: n }, () => record(extra)).map(async (r) => {
        await sink.append('llm_audit_log', r);
        return r;
      }),
    );

  // 1. Unparseable records: moved aside, the good ones around them ship.
  t.ok(await until(shipped), 'the good records around the unparseable ones ship');
  t.equal(
    await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'unparseable' }),
    3,
  );
  const list = await runDvx(['wal', 'dead-letter', 'list', '--dir', dir]);
  const entries = list.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  t.match(entries, [
    { reason: 'unparseable', raw: '{"id":"torn', error: { name: 'SyntaxError' }, wal_position: { segment: 1 } },
    { reason: 'unparseable', raw: '42', error: { message: /not an object \(number\)/ } },
    { reason: 'unparseable', raw: '[{"id":"in-an-array"}]', error: { message: /\(array\)/ } },
  ]);

  // 2. The segment cannot be read (its path is a directory); appends still reach the file by its handle.
  await rename(segment, `${segment}.away`);
  await mkdir(segment);
  const duringRead = await appendSome(5);
  t.ok(await until(async () => (await failures('read')) >= 2), 'read failures are counted and retried');
  t.notOk(shipped(), 'the records wait in the WAL');
  await rmdir(segment);
  await rename(`${segment}.away`, segment);
  t.ok(await until(shipped), 'shipping resumes once the segment is readable');

  // 3. The checkpoint cannot be written (its temporary file's path is a directory): the batch reaches
  // the store, the checkpoint does not move, the batch is shipped again and deduplicated.
  await mkdir(join(tableDir, 'checkpoint.json.tmp'));
  const duringCheckpoint = await appendSome(5);
  t.ok(await until(async () => (await failures('checkpoint')) >= 2), 'checkpoint failures are counted and retried');
  t.notOk(shipped(), 'the checkpoint has not moved');
  await rmdir(join(tableDir, 'checkpoint.json.tmp'));
  t.ok(await until(shipped), 'shipping resumes once the checkpoint can be written');

  // 4. The store is cut off: retried, never dead-lettered.
  await relay.cut();
  const duringCut = await appendSome(5);
  t.ok(await until(async () => (await failures('store')) >= 2), 'store failures are counted and retried');
  t.notOk(shipped());
  await relay.restore();
  t.ok(await until(shipped), 'shipping resumes once the store is back');

  // 5. The dead-letter spool cannot be written (its path is a file) when a record must go there: the
  // batch stays in the WAL until it can.
  await rename(join(tableDir, 'dead-letter'), join(tableDir, 'dead-letter.away'));
  await writeFile(join(tableDir, 'dead-letter'), 'in the way');
  const [rejected] = await appendSome(1, { model: 'nul\u0000' });
  t.ok(await until(async () => (await failures('dead_letter')) >= 2), 'dead-letter failures are counted and retried');
  t.notOk(shipped(), 'the rejected record is not passed over before it is dead-lettered');
  await unlink(join(tableDir, 'dead-letter'));
  await rename(join(tableDir, 'dead-letter.away'), join(tableDir, 'dead-letter'));
  t.ok(await until(shipped), 'shipping resumes once the spool can be written');
  t.equal(
    await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
    1,
  );
  t.equal(await metric(registry, 'dvx_audit_dead_letter_pending', { table: 'llm_audit_log' }), 4);
  const after = (await runDvx(['wal', 'dead-letter', 'list', '--dir', dir])).stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  t.match(after.at(-1), { id: rejected.id, reason: 'rejected', error: { store_code: '22P05' } });

  // Everything good arrived exactly once.
  const c = new pg.Client({ connectionString: pgdb.dsn });
  await c.connect();
  const { rows } = await c.query<{ n: number; d: number }>(
    'SELECT count(*)::int AS n, count(DISTINCT id)::int AS d FROM llm_audit_log',
  );
  await c.end();
  const good = before.length + duringRead.length + duringCheckpoint.length + duringCut.length;
  t.same(rows[0], { n: good, d: good });

  // Each failure was logged with its error object, stack included, and the step.
  for (const reason of ['read', 'checkpoint', 'store', 'dead_letter']) {
    const line = lines.find((l) => l.reason === reason);
    t.match(
      line,
      { level: 'warn', table: 'llm_audit_log', err: { message: String, stack: String } },
      `the ${reason} failure is logged with its error`,
    );
  }
  t.match(
    lines.find((l) => (l.msg as string).startsWith('audit records the store rejects')),
    { ids: [rejected.id], errors: [{ id: rejected.id, store_code: '22P05' }] },
  );
  t.same(rejections, [], 'no unhandled rejection');
});
