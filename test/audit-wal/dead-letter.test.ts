import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createClient } from '@clickhouse/client';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { newId } from '../../core/ids.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { openStore } from '../../audit-wal/store.ts';
import { StoreRefusesAllError, StoreRejectedError, StoreUnavailableError } from '../../audit-wal/errors.ts';
import { insertBisecting } from '../../audit-wal/bisect.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { startTcpProxy } from '../fixtures/tcp-proxy.ts';
import { runDvx } from '../fixtures/run-dvx.ts';
import { until, metric } from '../fixtures/eventually.ts';

// A record the store will never take, among good ones, against the real stores: the good ones arrive,
// the bad one goes to the dead-letter spool (metric, `dvx wal dead-letter list`), later records keep
// shipping, and `dvx wal dead-letter replay` ships it once the store is fixed. A store that is down is
// retried and never dead-letters anything.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
const tempDir = async () => {
  const d = await mkdtemp(join(tmpdir(), 'dvx-dead-'));
  dirs.push(d);
  return d;
};
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const record = (i: number, extra: Record<string, unknown> = {}) => ({
  id: newId(),
  event_time: new Date().toISOString(),
  org_id: 'org-1',
  agent_id: `agent-${i % 3}`,
  agent_name: 'a',
  enclave_id: 'e',
  format: 'anthropic-messages',
  upstream_format: null,
  path: '/v1/messages',
  model: 'claude',
  status: 200,
  upstream_status: 200,
  latency_ms: 1.5,
  upstream_latency_ms: 1,
  request_bytes: 100,
  response_bytes: 200,
  input_tokens: 10,
  output_tokens: 5,
  decision: 'allow',
  findings: [],
  inspection_failopen: false,
  error: null,
  ...extra,
});
const ship = { idleMs: 50, batchRows: 100, backoffMs: { base: 20, max: 200 } };

const jsonLines = (s: string) =>
  s
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown> & { id: string });

t.test(
  'PostgreSQL: rejected records are dead-lettered, the rest ship; replay after the fix ships what now fits',
  async (t) => {
    const pgdb = await freshPgDatabase('dvx_dead');
    if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
    t.teardown(pgdb.drop);
    const dir = await tempDir();
    const registry = createRegistry();
    const sink = await WalSink.open({ dir, dsn: pgdb.dsn, log: quiet, registry, shipper: ship });
    // PostgreSQL text cannot hold NUL (22P05); 1e19 is past bigint (22003).
    const nul = record(1, { model: 'claude\u0000evil' });
    const huge = record(2, { input_tokens: 1e19 });
    const good = Array.from({ length: 60 }, (_, i) => record(i));
    await Promise.all(
      [...good.slice(0, 25), nul, ...good.slice(25, 50), huge, ...good.slice(50)].map((r) =>
        sink.append('llm_audit_log', r),
      ),
    );
    const wal = sink.table('llm_audit_log')!;
    t.ok(await until(() => wal.stats().unshippedBytes === 0), 'the table ships past the records PostgreSQL rejects');
    const later = Array.from({ length: 10 }, (_, i) => record(i));
    await Promise.all(later.map((r) => sink.append('llm_audit_log', r)));
    t.ok(await until(() => wal.stats().unshippedBytes === 0), 'later records keep shipping');
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      2,
      'each rejected record counted once',
    );
    t.equal(await metric(registry, 'dvx_audit_dead_letter_pending', { table: 'llm_audit_log' }), 2);
    t.equal(await metric(registry, 'dvx_audit_shipped_total', { table: 'llm_audit_log' }), 70);
    await sink.close();

    const c = new pg.Client({ connectionString: pgdb.dsn });
    await c.connect();
    t.teardown(() => c.end());
    const ids = async () =>
      new Set((await c.query<{ id: string }>('SELECT id FROM llm_audit_log')).rows.map((r) => r.id));
    const stored = await ids();
    t.equal(stored.size, 70, 'every good record arrived, once');
    t.ok(!stored.has(nul.id) && !stored.has(huge.id), 'the rejected ones did not');

    const list = await runDvx(['wal', 'dead-letter', 'list', '--dir', dir]);
    t.equal(list.code, 0, list.stderr);
    const entries = jsonLines(list.stdout);
    t.same(entries.map((e) => e.id).sort(), [nul.id, huge.id].sort());
    t.match(
      entries.find((e) => e.id === nul.id),
      {
        table: 'llm_audit_log',
        reason: 'rejected',
        dead_lettered_at: String,
        error: { name: 'StoreRejectedError', store_code: '22P05', message: /Unicode escape/ },
        record: { id: nul.id, model: 'claude\u0000evil' },
      },
    );
    t.match(
      entries.find((e) => e.id === huge.id),
      { error: { store_code: '22003', message: /out of range/ }, record: { input_tokens: 1e19 } },
    );

    const stat = await runDvx(['wal', 'stat', '--dir', dir]);
    t.match(
      jsonLines(stat.stdout).find((l) => l.table === 'llm_audit_log'),
      { dead_letter: 2, unshipped_bytes: 0 },
      'dvx wal stat counts them',
    );

    let replay = await runDvx(['wal', 'dead-letter', 'replay', '--dir', dir, '--audit-dsn', pgdb.dsn]);
    t.equal(replay.code, 1, 'replayed as they are, both are refused again and stay');
    t.same(
      jsonLines(replay.stdout).map((l) => l.replay),
      ['kept', 'kept'],
    );

    // The operator widens the column; the NUL can never be stored as text.
    await c.query('ALTER TABLE llm_audit_log ALTER COLUMN input_tokens TYPE numeric');
    replay = await runDvx(['wal', 'dead-letter', 'replay', '--dir', dir, '--audit-dsn', pgdb.dsn]);
    t.equal(replay.code, 1, replay.stderr);
    t.match(jsonLines(replay.stdout), [
      { id: huge.id, replay: 'shipped' },
      { id: nul.id, replay: 'kept', error: { store_code: '22P05' } },
    ]);
    const shipped = await c.query<{ n: string }>('SELECT input_tokens::text AS n FROM llm_audit_log WHERE id = $1', [
      huge.id,
    ]);
    t.same(shipped.rows, [{ n: '10000000000000000000' }], 'the replayed record arrived as it was');
    const after = jsonLines((await runDvx(['wal', 'dead-letter', 'list', '--dir', dir])).stdout);
    t.match(after, [{ id: nul.id, replays: 2 }], 'only the record still refused stays');
    t.equal(after.length, 1);
  },
);

t.test('PostgreSQL: a failed batch inserts nothing; errors are classified', async (t) => {
  const pgdb = await freshPgDatabase('dvx_dead');
  if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
  t.teardown(pgdb.drop);
  const store = await openStore(pgdb.dsn);
  t.teardown(() => store.close());
  await store.ensureSchema();
  const err = await store
    .insert('llm_audit_log', [record(1), record(2, { findings: [{ match: 'x\u0000' }] }), record(3)])
    .catch((e: unknown) => e);
  t.type(err, StoreRejectedError, 'a NUL in the jsonb findings is the data');
  t.equal((err as StoreRejectedError).storeCode, '22P05');
  t.ok((err as Error).cause, 'the driver error is kept as the cause');
  const c = new pg.Client({ connectionString: pgdb.dsn });
  await c.connect();
  t.equal((await c.query('SELECT count(*)::int AS n FROM llm_audit_log')).rows[0].n, 0, 'nothing of the batch went in');
  await c.end();
  const down = await openStore('postgres://postgres@127.0.0.1:1/none');
  const refused = await down.insert('llm_audit_log', [record(1)]).catch((e: unknown) => e);
  await down.close();
  t.type(refused, StoreUnavailableError, 'connection refused is unavailable');
});

async function clickhouseUp(): Promise<boolean> {
  const c = createClient({ url: 'http://127.0.0.1:8123' });
  try {
    return (await c.ping()).success;
  } catch {
    return false;
  } finally {
    await c.close();
  }
}

t.test(
  'ClickHouse: rejected records are dead-lettered, the rest ship, a store that is down is retried; replay after the fix',
  async (t) => {
    if (!(await clickhouseUp())) {
      if (process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123 (.ci/run starts it)');
      else t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
      return;
    }
    const db = `dvx_dead_${Date.now().toString(36)}`;
    const admin = createClient({ url: 'http://127.0.0.1:8123' });
    t.teardown(async () => {
      await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
      await admin.close();
    });
    const relay = await startTcpProxy(8123);
    t.teardown(() => relay.close());
    const dir = await tempDir();
    const registry = createRegistry();
    const sink = await WalSink.open({
      dir,
      dsn: `clickhouse://default@127.0.0.1:${relay.port}/${db}`,
      log: quiet,
      registry,
      shipper: ship,
    });
    // -1 in a UInt16 (CANNOT_PARSE_NUMBER, 72); a lone UTF-16 surrogate from an agent's JSON (25).
    const negative = record(1, { status: -1 });
    const surrogate = record(2, { model: 'claude\ud800' });
    const good = Array.from({ length: 60 }, (_, i) => record(i));
    await Promise.all(
      [...good.slice(0, 30), negative, ...good.slice(30, 45), surrogate, ...good.slice(45)].map((r) =>
        sink.append('llm_audit_log', r),
      ),
    );
    const wal = sink.table('llm_audit_log')!;
    t.ok(await until(() => wal.stats().unshippedBytes === 0), 'the table ships past the records ClickHouse rejects');
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      2,
    );

    // Down: retried, never dead-lettered, shipped when back.
    await relay.cut();
    const during = Array.from({ length: 20 }, (_, i) => record(i));
    await Promise.all(during.map((r) => sink.append('llm_audit_log', r)));
    t.ok(
      await until(
        async () =>
          (await metric(registry, 'dvx_audit_ship_failures_total', { table: 'llm_audit_log', reason: 'store' })) >= 2,
      ),
      'the store being down is counted as a store failure',
    );
    t.ok(wal.stats().unshippedBytes > 0, 'records wait in the WAL');
    await relay.restore();
    t.ok(await until(() => wal.stats().unshippedBytes === 0), 'shipped when the store is back');
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      2,
      'nothing dead-lettered while the store was down',
    );
    t.equal(await metric(registry, 'dvx_audit_dead_letter_pending', { table: 'llm_audit_log' }), 2);
    await sink.close();

    const ids = async () =>
      new Set(
        (
          await (
            await admin.query({ query: `SELECT id FROM ${db}.llm_audit_log FINAL`, format: 'JSONEachRow' })
          ).json<{ id: string }>()
        ).map((r) => r.id),
      );
    const stored = await ids();
    t.equal(stored.size, 80, 'every good record arrived');
    t.ok(!stored.has(negative.id) && !stored.has(surrogate.id), 'the rejected ones did not');

    const entries = jsonLines((await runDvx(['wal', 'dead-letter', 'list', '--dir', dir])).stdout);
    t.same(entries.map((e) => e.id).sort(), [negative.id, surrogate.id].sort());
    t.match(
      entries.find((e) => e.id === negative.id),
      { reason: 'rejected', error: { store_code: '72', message: /Unsigned type/ }, record: { status: -1 } },
    );
    t.match(
      entries.find((e) => e.id === surrogate.id),
      { error: { store_code: '25', message: /surrogate/ } },
    );

    // The operator makes status signed; the surrogate stays refused.
    await admin.command({ query: `ALTER TABLE ${db}.llm_audit_log MODIFY COLUMN status Int32` });
    const replay = await runDvx([
      'wal',
      'dead-letter',
      'replay',
      '--dir',
      dir,
      '--audit-dsn',
      `clickhouse://default@127.0.0.1:8123/${db}`,
    ]);
    t.equal(replay.code, 1, replay.stderr);
    t.match(jsonLines(replay.stdout), [
      { id: negative.id, replay: 'shipped' },
      { id: surrogate.id, replay: 'kept' },
    ]);
    const back = await (
      await admin.query({
        query: `SELECT status FROM ${db}.llm_audit_log WHERE id = '${negative.id}'`,
        format: 'JSONEachRow',
      })
    ).json();
    t.same(back, [{ status: -1 }]);
    t.same(
      jsonLines((await runDvx(['wal', 'dead-letter', 'list', '--dir', dir])).stdout).map((e) => e.id),
      [surrogate.id],
    );
  },
);

t.test('ClickHouse: a batch that fails mid-way inserts nothing; errors are classified', async (t) => {
  if (!(await clickhouseUp())) return t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
  const db = `dvx_dead_${Date.now().toString(36)}b`;
  const store = await openStore(`clickhouse://default@127.0.0.1:8123/${db}`);
  t.teardown(async () => {
    const admin = createClient({ url: 'http://127.0.0.1:8123' });
    await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
    await admin.close();
    await store.close();
  });
  await store.ensureSchema();
  const batch = [
    ...Array.from({ length: 500 }, (_, i) => record(i)),
    record(0, { status: -1 }),
    ...Array.from({ length: 500 }, (_, i) => record(i)),
  ];
  const err = await store.insert('llm_audit_log', batch).catch((e: unknown) => e);
  t.type(err, StoreRejectedError);
  t.ok((err as Error).cause, 'the client error is kept as the cause');
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  const n = await (
    await admin.query({ query: `SELECT count() AS n FROM ${db}.llm_audit_log`, format: 'JSONEachRow' })
  ).json<{ n: string }>();
  await admin.close();
  t.same(n, [{ n: '0' }], 'not the 500 rows before the bad one either');
  const down = await openStore('clickhouse://default@127.0.0.1:1/x');
  const refused = await down.insert('llm_audit_log', [record(1)]).catch((e: unknown) => e);
  await down.close();
  t.type(refused, StoreUnavailableError, 'connection refused is unavailable');
});

// A record that is a JSON object with objects where strings are meant (`{"toString":1}`
// as a text column, an object as event_time) once threw in the row mapping, outside the store's error
// classification: the shipper took it for a store that is down and retried it forever. Mapping is
// total now: such a record ships, its odd values as their JSON text.
const odd = (i: number) => ({
  ...record(i),
  model: { toString: 1 },
  path: ['x'],
  agent_name: { valueOf: {} },
  event_time: { toString: 1 },
});
const oddEvent = () => ({
  id: newId(),
  event_time: { toString: 1 },
  kind: { a: 1 },
  action: { toString: 1 },
  org_id: 'org-1',
  attrs: { k: { toString: 1 }, n: 2 },
});

// And the opposite case: a store that refuses every record (an operator's schema change) is a store
// problem, not a few bad records: the batch is retried (reason `refused_all`), never dead-lettered
// whole, and ships once the schema is put right.

t.test(
  'PostgreSQL: records with objects where text is meant ship; a store refusing everything is retried, not dead-lettered',
  async (t) => {
    const pgdb = await freshPgDatabase('dvx_dead');
    if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
    t.teardown(pgdb.drop);
    const dir = await tempDir();
    const registry = createRegistry();
    // Every batch probed (a group commit may hand the shipper a batch of one), for a bounded 200 rounds.
    const sink = await WalSink.open({
      dir,
      dsn: pgdb.dsn,
      log: quiet,
      registry,
      shipper: { ...ship, refusedAllProbe: 1, refusedAllRounds: 200 },
    });
    const c = new pg.Client({ connectionString: pgdb.dsn });
    await c.connect();
    t.teardown(() => c.end());
    const a = odd(1);
    const e = oddEvent();
    await sink.append('llm_audit_log', a);
    await sink.append('audit_events', e);
    const llm = sink.table('llm_audit_log')!;
    const events = sink.table('audit_events')!;
    t.ok(await until(() => llm.stats().unshippedBytes === 0 && events.stats().unshippedBytes === 0), 'both shipped');
    t.same((await c.query('SELECT model, path, agent_name FROM llm_audit_log WHERE id = $1', [a.id])).rows, [
      { model: '{"toString":1}', path: '["x"]', agent_name: '{"valueOf":{}}' },
    ]);
    t.same((await c.query('SELECT kind, action, attrs FROM audit_events WHERE id = $1', [e.id])).rows, [
      { kind: '{"a":1}', action: '{"toString":1}', attrs: { k: { toString: 1 }, n: 2 } },
    ]);
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      0,
    );
    t.equal(
      await metric(registry, 'dvx_audit_ship_failures_total', { table: 'llm_audit_log', reason: 'store' }),
      0,
      'no failed attempt at all',
    );

    // Every insert now fails with a data error (23514), whatever the record.
    await c.query('ALTER TABLE llm_audit_log ADD CONSTRAINT closed CHECK (false) NOT VALID');
    const batch = Array.from({ length: 20 }, (_, i) => record(i));
    await Promise.all(batch.map((r) => sink.append('llm_audit_log', r)));
    t.ok(
      await until(
        async () =>
          (await metric(registry, 'dvx_audit_ship_failures_total', {
            table: 'llm_audit_log',
            reason: 'refused_all',
          })) >= 2,
      ),
      'counted as refused_all and retried',
    );
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      0,
      'nothing dead-lettered',
    );
    t.ok(llm.stats().unshippedBytes > 0, 'the records wait in the WAL');
    // Without a record shipped before (a fresh start), 8 records probed across the batch decide.
    const store = await openStore(pgdb.dsn);
    t.teardown(() => store.close());
    t.type(
      await insertBisecting(store, 'llm_audit_log', batch, { probe: 8 }).catch((e: unknown) => e),
      StoreRefusesAllError,
      'probed: the store refuses all',
    );
    await c.query('ALTER TABLE llm_audit_log DROP CONSTRAINT closed');
    const probed = [...Array.from({ length: 12 }, (_, i) => record(i)), record(0, { input_tokens: 1e19 })];
    t.same(
      (await insertBisecting(store, 'llm_audit_log', probed, { probe: 8 })).map((r) => r.row.id),
      [probed[12].id],
      'probed: one taken, the batch is bisected',
    );
    t.ok(await until(() => llm.stats().unshippedBytes === 0), 'shipped once the schema is put right');
    t.equal(
      (await c.query('SELECT count(*)::int AS n FROM llm_audit_log WHERE id = ANY($1)', [batch.map((r) => r.id)]))
        .rows[0].n,
      20,
    );
    t.equal(await metric(registry, 'dvx_audit_dead_letter_pending', { table: 'llm_audit_log' }), 0);

    // A few bad records among good ones are still the records: dead-lettered, the rest ship.
    const mixed = [
      ...Array.from({ length: 10 }, (_, i) => record(i)),
      record(0, { model: 'a\u0000b' }),
      ...Array.from({ length: 10 }, (_, i) => record(i)),
    ];
    await Promise.all(mixed.map((r) => sink.append('llm_audit_log', r)));
    t.ok(await until(() => llm.stats().unshippedBytes === 0));
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      1,
    );
    await sink.close();
  },
);

t.test(
  'PostgreSQL: a batch of hostile records that fails every probe is retried a bounded number of rounds, then dead-lettered; nothing is re-inserted',
  async (t) => {
    const pgdb = await freshPgDatabase('dvx_dead');
    if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
    t.teardown(pgdb.drop);
    const dir = await tempDir();
    const registry = createRegistry();
    const c = new pg.Client({ connectionString: pgdb.dsn });
    await c.connect();
    t.teardown(() => c.end());
    const relay = await startTcpProxy(5432);
    t.teardown(() => relay.close());
    const sink = await WalSink.open({
      dir,
      dsn: pgdb.dsn.replace('127.0.0.1:5432', `127.0.0.1:${relay.port}`),
      log: quiet,
      registry,
      shipper: { ...ship, refusedAllRounds: 3 },
    });
    // One record of an org that is then erased from the store: the shipper must never bring it back.
    const erased = record(1, { org_id: 'org-erased' });
    await sink.append('llm_audit_log', erased);
    await sink.shipped();
    t.equal(
      (await c.query(`DELETE FROM llm_audit_log WHERE org_id = 'org-erased'`)).rowCount,
      1,
      'erased from the store',
    );
    // An agent's records that PostgreSQL refuses (a NUL in model), spooled while the store is away, so
    // they reach it as one batch of 30 whose every probed record is refused.
    await relay.cut();
    const hostile = Array.from({ length: 30 }, (_, i) => record(i, { model: 'x\u0000y' }));
    await Promise.all(hostile.map((r) => sink.append('llm_audit_log', r)));
    await relay.restore();
    t.ok(
      await until(
        async () =>
          (await metric(registry, 'dvx_audit_dead_letter_records_total', {
            table: 'llm_audit_log',
            reason: 'rejected',
          })) === 30,
      ),
      'the hostile records are dead-lettered',
    );
    t.equal(
      await metric(registry, 'dvx_audit_ship_failures_total', { table: 'llm_audit_log', reason: 'refused_all' }),
      3,
      'after 3 rounds of probes, not for ever',
    );
    const later = record(99);
    await sink.append('llm_audit_log', later);
    const wal = sink.table('llm_audit_log')!;
    t.ok(await until(() => wal.stats().unshippedBytes === 0), 'the table moves on');
    t.same(
      (await c.query('SELECT id FROM llm_audit_log WHERE id = $1', [later.id])).rows.length,
      1,
      'a later record shipped',
    );
    t.equal(
      (await c.query(`SELECT count(*)::int AS n FROM llm_audit_log WHERE org_id = 'org-erased'`)).rows[0].n,
      0,
      'no record of the erased org came back',
    );
    await sink.close();
  },
);

t.test(
  'ClickHouse: records with objects where text is meant ship; a store refusing everything is retried, not dead-lettered',
  async (t) => {
    if (!(await clickhouseUp())) return t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
    const db = `dvx_dead_${Date.now().toString(36)}c`;
    const admin = createClient({ url: 'http://127.0.0.1:8123' });
    t.teardown(async () => {
      await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
      await admin.close();
    });
    const dir = await tempDir();
    const registry = createRegistry();
    const sink = await WalSink.open({
      dir,
      dsn: `clickhouse://default@127.0.0.1:8123/${db}`,
      log: quiet,
      registry,
      shipper: { ...ship, refusedAllProbe: 1, refusedAllRounds: 200 },
    });
    const a = odd(1);
    const e = oddEvent();
    await sink.append('llm_audit_log', a);
    await sink.append('audit_events', e);
    const llm = sink.table('llm_audit_log')!;
    const events = sink.table('audit_events')!;
    t.ok(await until(() => llm.stats().unshippedBytes === 0 && events.stats().unshippedBytes === 0), 'both shipped');
    const q = async (query: string) => (await admin.query({ query, format: 'JSONEachRow' })).json();
    t.same(await q(`SELECT model, path FROM ${db}.llm_audit_log WHERE id = '${a.id}'`), [
      { model: '{"toString":1}', path: '["x"]' },
    ]);
    t.same(await q(`SELECT action, attrs_keys, attrs_values FROM ${db}.audit_events WHERE id = '${e.id}'`), [
      { action: '{"toString":1}', attrs_keys: ['k', 'n'], attrs_values: ['{"toString":1}', '2'] },
    ]);
    t.equal(
      await metric(registry, 'dvx_audit_ship_failures_total', { table: 'llm_audit_log', reason: 'store' }),
      0,
      'no failed attempt at all',
    );

    // The operator turns path into a number: every record's path now fails to parse.
    await admin.command({ query: `ALTER TABLE ${db}.llm_audit_log MODIFY COLUMN path UInt8` }).catch(async () => {
      await admin.command({ query: `TRUNCATE TABLE ${db}.llm_audit_log` });
      await admin.command({ query: `ALTER TABLE ${db}.llm_audit_log MODIFY COLUMN path UInt8` });
    });
    const batch = Array.from({ length: 20 }, (_, i) => record(i));
    await Promise.all(batch.map((r) => sink.append('llm_audit_log', r)));
    t.ok(
      await until(
        async () =>
          (await metric(registry, 'dvx_audit_ship_failures_total', {
            table: 'llm_audit_log',
            reason: 'refused_all',
          })) >= 2,
      ),
      'counted as refused_all and retried',
    );
    t.equal(
      await metric(registry, 'dvx_audit_dead_letter_records_total', { table: 'llm_audit_log', reason: 'rejected' }),
      0,
      'nothing dead-lettered',
    );
    t.ok(llm.stats().unshippedBytes > 0, 'the records wait in the WAL');
    await admin.command({ query: `ALTER TABLE ${db}.llm_audit_log MODIFY COLUMN path String` });
    t.ok(await until(() => llm.stats().unshippedBytes === 0), 'shipped once the schema is put right');
    t.same(
      await q(
        `SELECT count() AS n FROM (SELECT DISTINCT id FROM ${db}.llm_audit_log WHERE id IN (${batch.map((r) => `'${r.id}'`).join(', ')}))`,
      ),
      [{ n: '20' }],
    );
    await sink.close();
  },
);
