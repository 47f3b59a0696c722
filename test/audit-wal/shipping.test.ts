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
import { startTcpProxy } from '../fixtures/tcp-proxy.ts';
import { until } from '../fixtures/eventually.ts';

// Shipping to real stores: PGlite, PostgreSQL (127.0.0.1:5432, database test) and ClickHouse
// (127.0.0.1:8123, Debian's 18.16), with the store cut off mid-ship and restored.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
const tempDir = async () => {
  const d = await mkdtemp(join(tmpdir(), 'dvx-ship-'));
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
  findings:
    i % 2
      ? [
          {
            inspector_type: 'pii',
            severity: 'warn',
            description: 'email address',
            match: 'a@ex****',
            location: 'request_body',
          },
        ]
      : [],
  inspection_failopen: false,
  error: null,
  ...extra,
});

t.test('PGlite: appended records are shipped once, findings as JSON', async (t) => {
  const dir = await tempDir();
  const storeDir = await tempDir();
  const sink = await WalSink.open({
    dir,
    dsn: `pglite://${storeDir}`,
    log: quiet,
    registry: createRegistry(),
    shipper: { idleMs: 50 },
  });
  const records = Array.from({ length: 300 }, (_, i) => record(i));
  await Promise.all(records.map((r) => sink.append('llm_audit_log', r)));
  await sink.append('audit_events', {
    id: newId(),
    event_time: new Date().toISOString(),
    kind: 'network_flow',
    action: 'connect',
    attrs: { k: 'v' },
    dst_host: 'example.com',
    dst_port: 443,
    org_id: 'org-1',
    identified: true,
  });
  const wal = sink.table('llm_audit_log')!;
  t.ok(await until(async () => wal.stats().unshippedBytes === 0), 'shipped');
  await sink.close();
  const store = await openStore(`pglite://${storeDir}`);
  const { PGlite } = await import('@electric-sql/pglite');
  void store;
  await store.close();
  const db = new PGlite(storeDir);
  const count = await db.query<{ n: number }>(
    'SELECT count(*)::int AS n, count(DISTINCT id)::int AS d FROM llm_audit_log',
  );
  t.same(count.rows[0], { n: 300, d: 300 });
  const withFinding = await db.query<{ findings: unknown }>(
    'SELECT findings FROM llm_audit_log WHERE jsonb_array_length(findings) = 1 LIMIT 1',
  );
  t.match(withFinding.rows[0].findings, [{ inspector_type: 'pii', match: 'a@ex****' }]);
  const flow = await db.query<{ kind: string; attrs: unknown; dst_port: number }>(
    'SELECT kind, attrs, dst_port FROM audit_events',
  );
  t.same(flow.rows, [{ kind: 'network_flow', attrs: { k: 'v' }, dst_port: 443 }]);
  await db.close();
});

async function pgDatabase(t: {
  plan: (n: number, reason?: string) => void;
  teardown: (fn: () => unknown) => void;
}): Promise<string | null> {
  const admin = new pg.Client({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
  try {
    await admin.connect();
  } catch (err) {
    t.plan(0, `PostgreSQL not reachable: ${(err as Error).message}`);
    return null;
  }
  const name = `dvx_ship_${Date.now().toString(36)}`;
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  t.teardown(async () => {
    const c = new pg.Client({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
    await c.connect();
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await c.end();
  });
  return name;
}

t.test('PostgreSQL cut off mid-ship, then restored: nothing lost, nothing duplicated', async (t) => {
  const db = await pgDatabase(t);
  if (!db) return;
  const relay = await startTcpProxy(5432);
  t.teardown(() => relay.close());
  const dir = await tempDir();
  const sink = await WalSink.open({
    dir,
    dsn: `postgres://postgres@127.0.0.1:${relay.port}/${db}`,
    log: quiet,
    registry: createRegistry(),
    shipper: { idleMs: 50, batchRows: 50, backoffMs: { base: 20, max: 200 } },
  });
  const first = Array.from({ length: 200 }, (_, i) => record(i));
  await Promise.all(first.map((r) => sink.append('llm_audit_log', r)));
  await relay.cut();
  const second = Array.from({ length: 300 }, (_, i) => record(i));
  await Promise.all(second.map((r) => sink.append('llm_audit_log', r)));
  await new Promise((r) => setTimeout(r, 500));
  t.ok(sink.table('llm_audit_log')!.stats().unshippedBytes > 0, 'records wait in the WAL while the store is away');
  await relay.restore();
  t.ok(
    await until(async () => sink.table('llm_audit_log')!.stats().unshippedBytes === 0),
    'shipped after the store came back',
  );
  await sink.close();
  const c = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:5432/${db}` });
  await c.connect();
  const { rows } = await c.query('SELECT count(*)::int AS n, count(DISTINCT id)::int AS d FROM llm_audit_log');
  await c.end();
  t.same(rows[0], { n: 500, d: 500 });
});

t.test('a retried batch inserts nothing twice (Postgres and ClickHouse)', async (t) => {
  const db = await pgDatabase(t);
  if (!db) return;
  const rows = Array.from({ length: 20 }, (_, i) => record(i));
  const store = await openStore(`postgres://postgres@127.0.0.1:5432/${db}`);
  await store.ensureSchema();
  await store.ensureSchema();
  await store.insert('llm_audit_log', rows);
  await store.insert('llm_audit_log', rows);
  await store.close();
  const c = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:5432/${db}` });
  await c.connect();
  t.equal((await c.query('SELECT count(*)::int AS n FROM llm_audit_log')).rows[0].n, 20);
  await c.end();
});

async function clickhouseUp(): Promise<boolean> {
  const c = createClient({ url: 'http://127.0.0.1:8123' });
  try {
    return (await c.ping()).success;
  } finally {
    await c.close();
  }
}

t.test('ClickHouse cut off mid-ship, then restored: nothing lost, nothing duplicated', async (t) => {
  if (!(await clickhouseUp().catch(() => false))) {
    if (process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123 (.ci/run starts it)');
    else t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
    return;
  }
  const db = `dvx_ship_${Date.now().toString(36)}`;
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  t.teardown(async () => {
    await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
    await admin.close();
  });
  const relay = await startTcpProxy(8123);
  t.teardown(() => relay.close());
  const dir = await tempDir();
  const sink = await WalSink.open({
    dir,
    dsn: `clickhouse://default@127.0.0.1:${relay.port}/${db}`,
    log: quiet,
    registry: createRegistry(),
    shipper: { idleMs: 50, batchRows: 100, backoffMs: { base: 20, max: 200 } },
  });
  await Promise.all(Array.from({ length: 300 }, (_, i) => sink.append('llm_audit_log', record(i))));
  await sink.append('audit_events', {
    id: newId(),
    event_time: new Date().toISOString(),
    kind: 'network_flow',
    attrs: { a: '1', b: '2' },
    dst_port: 8443,
    org_id: 'o',
    identified: true,
  });
  await relay.cut();
  await Promise.all(Array.from({ length: 400 }, (_, i) => sink.append('llm_audit_log', record(i))));
  await new Promise((r) => setTimeout(r, 500));
  await relay.restore();
  t.ok(
    await until(
      async () =>
        sink.table('llm_audit_log')!.stats().unshippedBytes === 0 &&
        sink.table('audit_events')!.stats().unshippedBytes === 0,
    ),
    'shipped after the store came back',
  );
  await sink.close();
  const count = await (
    await admin.query({
      query: `SELECT count() AS n, uniqExact(id) AS d FROM ${db}.llm_audit_log FINAL`,
      format: 'JSONEachRow',
    })
  ).json<{ n: string; d: string }>();
  t.same(count, [{ n: '700', d: '700' }]);
  const flow = await (
    await admin.query({
      query: `SELECT kind, attrs_keys, attrs_values, dst_port, identified FROM ${db}.audit_events`,
      format: 'JSONEachRow',
    })
  ).json();
  t.same(flow, [
    { kind: 'network_flow', attrs_keys: ['a', 'b'], attrs_values: ['1', '2'], dst_port: 8443, identified: 1 },
  ]);
  const store = await openStore(`clickhouse://default@127.0.0.1:8123/${db}`);
  const again = Array.from({ length: 5 }, (_, i) => record(i));
  await store.insert('llm_audit_log', again);
  await store.insert('llm_audit_log', again);
  await store.close();
  const after = await (
    await admin.query({ query: `SELECT count() AS n FROM ${db}.llm_audit_log FINAL`, format: 'JSONEachRow' })
  ).json<{ n: string }>();
  t.same(after, [{ n: '705' }], 'a retried batch collapses');
});
