import t, { type Test } from 'tap';
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
import { postgresRow } from '../../audit-wal/rows.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { runDvx } from '../fixtures/run-dvx.ts';

// The tool_call_decisions audit table (llmproxy's tool-call decisions) shipped through the WAL to each
// store (PGlite, PostgreSQL, ClickHouse 18.16), its columns typed, erased with its org, listed by `dvx wal`.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
const tempDir = async () => {
  const d = await mkdtemp(join(tmpdir(), 'dvx-decisions-'));
  dirs.push(d);
  return d;
};
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });

const decision = (org: string, extra: Record<string, unknown> = {}) => ({
  id: newId(),
  event_time: '2026-11-23T10:00:00.250Z',
  call_id: 'call-1',
  org_id: org,
  agent_id: 'agent-1',
  agent_name: 'builder',
  enclave_id: 'enc-1',
  model: 'claude-sonnet-4',
  tool: 'transfer',
  tool_call_id: 'toolu_01',
  args_digest: 'a'.repeat(64),
  arguments: '{"amount":1000,"note":"[REDACTED]"}',
  args_parsed: true,
  rule: 'money.rules[0]',
  inspector: 'money',
  summary: 'large transfers need a person',
  verdict: 'require_approval',
  outcome: 'allow',
  reason: 'approved by alice@example.com',
  policy_version: '0123456789abcdef',
  decided_by: 'alice@example.com',
  decided_at: '2026-11-23T10:00:07.125Z',
  approval_id: 'ap-1',
  held_ms: 6875.5,
  ...extra,
});
/** A policy allow: no rule, no approval, arguments that did not parse. */
const plainAllow = (org: string) =>
  decision(org, {
    rule: null,
    inspector: null,
    summary: null,
    verdict: 'allow',
    reason: 'no rule matched',
    decided_by: 'policy',
    approval_id: null,
    held_ms: 0,
    args_parsed: false,
    arguments: '{"amount": 5',
  });

async function shipped(dsn: string) {
  const dir = await tempDir();
  const sink = await WalSink.open({ dir, dsn, log: quiet, registry: createRegistry(), shipper: { idleMs: 20 } });
  const rows = [
    decision('org-1'),
    plainAllow('org-1'),
    decision('org-2', { outcome: 'deny', decided_by: 'agent-gone' }),
  ];
  for (const r of rows) await sink.append('tool_call_decisions', r);
  await sink.shipped(30_000);
  await sink.close();
  return { dir, rows };
}

t.test('the row mapping: booleans, times, nullable columns, numbers', async (t) => {
  const row = postgresRow('tool_call_decisions', { ...plainAllow('o'), held_ms: 'x', decided_at: 'not a time' });
  t.match(row, { args_parsed: false, rule: null, held_ms: 0, decided_at: '2026-11-23T10:00:00.250Z' });
  t.equal(postgresRow('tool_call_decisions', { args_parsed: 'true' }).args_parsed, false, 'only a JSON true');
});

async function checkPostgres(
  t: Test,
  query: (sql: string) => Promise<Record<string, unknown>[]>,
  rows: Record<string, unknown>[],
) {
  const got = await query(
    'SELECT id, org_id, args_parsed, rule, held_ms, decided_at, event_time, approval_id, arguments, verdict, outcome, decided_by FROM tool_call_decisions ORDER BY org_id, held_ms',
  );
  t.equal(got.length, 3);
  const [allow, approved, gone] = got;
  t.match(allow, {
    id: rows[1].id,
    args_parsed: false,
    rule: null,
    held_ms: 0,
    approval_id: null,
    arguments: '{"amount": 5',
  });
  t.match(approved, {
    id: rows[0].id,
    args_parsed: true,
    rule: 'money.rules[0]',
    held_ms: 6875.5,
    approval_id: 'ap-1',
    verdict: 'require_approval',
    outcome: 'allow',
    decided_by: 'alice@example.com',
  });
  t.equal(new Date(approved.decided_at as string).toISOString(), '2026-11-23T10:00:07.125Z');
  t.equal(new Date(approved.event_time as string).toISOString(), '2026-11-23T10:00:00.250Z');
  t.match(gone, { org_id: 'org-2', outcome: 'deny', decided_by: 'agent-gone' });
}

t.test('PGlite: shipped, typed, erased with its org', async (t) => {
  const storeDir = await tempDir();
  const { rows } = await shipped(`pglite://${storeDir}`);
  const store = await openStore(`pglite://${storeDir}`);
  await store.close();
  const { PGlite } = await import('@electric-sql/pglite');
  const db = new PGlite(storeDir);
  await checkPostgres(t, async (sql) => (await db.query<Record<string, unknown>>(sql)).rows, rows);
  await db.close();
  const again = await openStore(`pglite://${storeDir}`);
  t.equal(await again.eraseOrg('org-1'), 2, "the org's decisions are erased");
  await again.close();
  const after = new PGlite(storeDir);
  t.same((await after.query('SELECT org_id FROM tool_call_decisions')).rows, [{ org_id: 'org-2' }]);
  await after.close();
});

t.test('PostgreSQL: shipped, typed, erased with its org', async (t) => {
  const fresh = await freshPgDatabase('dvx_decisions');
  if (!fresh) {
    if (process.env.CI) t.fail('PostgreSQL is not running on 127.0.0.1:5432');
    else t.plan(0, 'PostgreSQL not reachable');
    return;
  }
  t.teardown(() => fresh.drop());
  const { rows } = await shipped(fresh.dsn);
  const c = new pg.Client({ connectionString: fresh.dsn });
  await c.connect();
  t.teardown(() => c.end());
  await checkPostgres(t, async (sql) => (await c.query(sql)).rows, rows);
  const store = await openStore(fresh.dsn);
  // The org's llm_audit_log row goes with it (the erasure sweeps every table).
  await store.insert('llm_audit_log', [{ id: 'call-1', event_time: new Date().toISOString(), org_id: 'org-1' }]);
  t.equal(await store.eraseOrg('org-1'), 3);
  await store.close();
  t.same((await c.query('SELECT org_id FROM tool_call_decisions')).rows, [{ org_id: 'org-2' }]);
  t.equal((await c.query('SELECT count(*)::int AS n FROM llm_audit_log')).rows[0].n, 0);
});

t.test('ClickHouse: shipped, typed, erased with its org', async (t) => {
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  t.teardown(() => admin.close());
  if (
    !(await admin.ping().then(
      (p) => p.success,
      () => false,
    ))
  ) {
    if (process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123 (.ci/run starts it)');
    else t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
    return;
  }
  const db = `dvx_decisions_${Date.now().toString(36)}`;
  t.teardown(() => admin.command({ query: `DROP DATABASE IF EXISTS ${db}` }));
  const { rows } = await shipped(`clickhouse://default@127.0.0.1:8123/${db}`);
  const got = await (
    await admin.query({
      query: `SELECT id, org_id, args_parsed, rule, held_ms, decided_at, decided_at_ms, event_time_ms, approval_id, outcome FROM ${db}.tool_call_decisions FINAL ORDER BY org_id, held_ms`,
      format: 'JSONEachRow',
    })
  ).json<Record<string, unknown>>();
  t.equal(got.length, 3);
  t.match(got[0], { id: rows[1].id, args_parsed: 0, rule: '', held_ms: 0, approval_id: '' });
  t.match(got[1], {
    id: rows[0].id,
    args_parsed: 1,
    rule: 'money.rules[0]',
    held_ms: 6875.5,
    decided_at: '2026-11-23 10:00:07',
    decided_at_ms: 125,
    event_time_ms: 250,
    approval_id: 'ap-1',
  });
  const store = await openStore(`clickhouse://default@127.0.0.1:8123/${db}`);
  t.equal(await store.eraseOrg('org-1'), 2);
  await store.close();
  const left = await (
    await admin.query({ query: `SELECT org_id FROM ${db}.tool_call_decisions`, format: 'JSONEachRow' })
  ).json();
  t.same(left, [{ org_id: 'org-2' }]);
});

t.test('dvx wal stat and tail list the table', async (t) => {
  const storeDir = await tempDir();
  const dir = await tempDir();
  // The spool keeps shipped records too: `tail --all` reads them from the first retained one.
  const sink = await WalSink.open({
    dir,
    dsn: `pglite://${storeDir}`,
    log: quiet,
    registry: createRegistry(),
    tables: ['llm_audit_log', 'tool_call_decisions'],
  });
  await sink.append('tool_call_decisions', decision('org-1'));
  await sink.close();
  const stat = await runDvx(['wal', 'stat', '--dir', dir]);
  t.equal(stat.code, 0, stat.stderr);
  const tables = stat.stdout
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { table: string }).table);
  t.ok(tables.includes('tool_call_decisions'), tables.join(','));
  const tail = await runDvx(['wal', 'tail', '--dir', dir, '--table', 'tool_call_decisions', '--all']);
  t.equal(tail.code, 0, tail.stderr);
  t.match(JSON.parse(tail.stdout.trim().split('\n')[0]), { tool: 'transfer', decided_by: 'alice@example.com' });
});
