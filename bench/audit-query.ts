import { performance } from 'node:perf_hooks';
import { createClient } from '@clickhouse/client';
import pg from 'pg';
import { openStore, type AuditStore } from '../audit-wal/store.ts';
import type { AuditQuery } from '../audit-wal/query.ts';
import { clickhouseWhere, CH_EVENT_SELECT } from '../audit-wal/read.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { formatMs, table } from './measure.ts';

// npm run bench -- audit-query [--rows 10000000] [--pg-rows 1000000] [--runs 30]
//
// Typical persona queries of the audit read API (the predicate the control plane builds, through the
// store's own readEvents) over generated audit_events: ClickHouse with --rows, PostgreSQL with
// --pg-rows, and as the baseline the same conditions as one plain query sent by the bare ClickHouse
// client (ours reads in two passes: the page's ids from the light columns, then its rows). 100 orgs, 50 actors each,
// 10 % network flows, one row per 100 ms of simulated time. Target: p99 ≤ 100 ms on ClickHouse.

const ORGS = 100;
const T0 = 1_763_800_000; // seconds

function personas(endMs: number): [string, AuditQuery][] {
  const hour = new Date(endMs - 3_600_000);
  const q = (predicate: AuditQuery['predicate'], filters: AuditQuery['filters'] = {}): AuditQuery => ({
    predicate,
    filters,
    limit: 100,
    offset: 0,
  });
  return [
    ['member: own org, own actor', q({ orgs: ['org-7'], actor: 'user-7-3' })],
    ['org admin: own org, last hour', q({ orgs: ['org-7'] }, { since: hour })],
    [
      'org admin: own org, network flows to a host',
      q({ orgs: ['org-7'] }, { proto: 'tcp', dst_host: 'host-0.example' }),
    ],
    ['agent-operator: attributed to its agent', q({ orgs: ['org-7'], agent: 'agent-7-2' })],
    ['platform operator: every org, last hour', q({ orgs: 'all', kinds: ['event'] }, { since: hour })],
    ['platform operator: narrowed to one org', q({ orgs: 'all', kinds: ['event'] }, { org: 'org-42' })],
  ];
}

async function fillClickHouse(url: string, db: string, rows: number): Promise<void> {
  const ch = createClient({ url, request_timeout: 600_000 });
  const store = await openStore(`clickhouse://default@${new URL(url).host}/${db}`);
  await store.ensureSchema();
  await store.close();
  const have = Number(
    (
      (await (
        await ch.query({ query: `SELECT count() AS n FROM ${db}.audit_events`, format: 'JSONEachRow' })
      ).json()) as { n: string }[]
    )[0].n,
  );
  if (have !== rows) {
    await ch.command({ query: `TRUNCATE TABLE ${db}.audit_events` });
    await ch.command({ query: `TRUNCATE TABLE ${db}.\`.inner.audit_events_cp\`` });
    await ch.command({
      query: `INSERT INTO ${db}.audit_events (id, event_time, event_time_ms, kind, action, actor, actor_kind, agent_id, org_id, outcome, proto, dst_host, scope)
        SELECT toString(number), toDateTime(${T0} + intDiv(number, 10)), (number % 10) * 100,
               if(number % 10 = 0, 'network_flow', 'event'), if(number % 10 = 0, 'connect', 'grant.create'),
               concat('user-', toString(number % ${ORGS}), '-', toString(intDiv(number, ${ORGS}) % 50)), 'human-operator',
               concat('agent-', toString(number % ${ORGS}), '-', toString(number % 7)), concat('org-', toString(number % ${ORGS})),
               if(number % 13 = 0, 'deny', 'allow'), if(number % 10 = 0, 'tcp', ''), if(number % 10 = 0, concat('host-', toString(number % 5), '.example'), ''),
               concat('org:org-', toString(number % ${ORGS}))
        FROM system.numbers LIMIT ${rows}`,
    });
    await ch.command({ query: `OPTIMIZE TABLE ${db}.audit_events FINAL` }).catch(() => {});
  }
  await ch.close();
}

async function fillPostgres(dsn: string, rows: number): Promise<void> {
  const s = await openStore(dsn);
  await s.ensureSchema();
  await s.close();
  const c = new pg.Client({ connectionString: dsn });
  await c.connect();
  const have = Number((await c.query('SELECT count(*) AS n FROM audit_events')).rows[0].n);
  if (have !== rows) {
    await c.query('TRUNCATE audit_events');
    await c.query(`INSERT INTO audit_events (id, event_time, kind, action, actor, actor_kind, agent_id, org_id, outcome, proto, dst_host, scope)
      SELECT n::text, to_timestamp(${T0} + n / 10.0), CASE WHEN n % 10 = 0 THEN 'network_flow' ELSE 'event' END, CASE WHEN n % 10 = 0 THEN 'connect' ELSE 'grant.create' END,
             'user-' || (n % ${ORGS}) || '-' || ((n / ${ORGS}) % 50), 'human-operator', 'agent-' || (n % ${ORGS}) || '-' || (n % 7), 'org-' || (n % ${ORGS}),
             CASE WHEN n % 13 = 0 THEN 'deny' ELSE 'allow' END, CASE WHEN n % 10 = 0 THEN 'tcp' ELSE '' END,
             CASE WHEN n % 10 = 0 THEN 'host-' || (n % 5) || '.example' ELSE '' END, 'org:org-' || (n % ${ORGS})
      FROM generate_series(0, ${rows - 1}) AS n`);
    await c.query('ANALYZE audit_events');
  }
  await c.end();
}

async function time(fn: () => Promise<unknown>, runs: number): Promise<{ p50: number; p99: number; n: number }> {
  for (let i = 0; i < 3; i++) await fn();
  const ts: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    ts.push(performance.now() - t0);
  }
  ts.sort((a, b) => a - b);
  return {
    p50: ts[Math.floor(ts.length / 2)],
    p99: ts[Math.min(ts.length - 1, Math.floor(ts.length * 0.99))],
    n: ts.length,
  };
}

export async function main(args: string[]): Promise<void> {
  const arg = (name: string, d: number) => Number(args[args.indexOf(name) + 1]) || d;
  const rows = arg('--rows', 10_000_000);
  const pgRows = arg('--pg-rows', 1_000_000);
  const runs = arg('--runs', 30);
  const chUrl = 'http://127.0.0.1:8123';
  const chDb = 'dvx_bench_audit';
  const pgDsn = process.env.DVX_BENCH_PG ?? 'postgres://postgres@127.0.0.1:5432/test';
  const t0 = performance.now();
  await fillClickHouse(chUrl, chDb, rows);
  await fillPostgres(pgDsn, pgRows);
  process.stderr.write(`data ready in ${((performance.now() - t0) / 1000).toFixed(0)} s\n`);
  const ch: AuditStore = await openStore(`clickhouse://default@127.0.0.1:8123/${chDb}`);
  const pgStore: AuditStore = await openStore(pgDsn);
  const raw = createClient({ url: chUrl });
  const end = (T0 + rows / 10) * 1000;
  const pgEnd = (T0 + pgRows / 10) * 1000;
  const out: string[][] = [];
  for (const [i, [name, q]] of personas(end).entries()) {
    const chRes = await time(() => ch.readEvents(q), runs);
    // The single-pass query a store would send without our two-pass read.
    const rawSql = `SELECT ${CH_EVENT_SELECT} FROM ${chDb}.${q.predicate.orgs === 'all' && !q.filters.org ? 'audit_events_cp' : 'audit_events'} WHERE ${clickhouseWhere(q)} ORDER BY event_time, event_time_ms, id LIMIT 1 BY id LIMIT 0, 100`;
    const base = await time(async () => (await raw.query({ query: rawSql, format: 'JSONEachRow' })).json(), runs);
    const pgQ = personas(pgEnd)[i][1];
    const pgRes = await time(() => pgStore.readEvents(pgQ), runs);
    out.push([
      name,
      `${(await ch.readEvents(q)).length}`,
      formatMs(chRes.p50),
      formatMs(chRes.p99),
      formatMs(base.p50),
      `${(chRes.p50 / base.p50).toFixed(2)}×`,
      formatMs(pgRes.p50),
      formatMs(pgRes.p99),
    ]);
  }
  await ch.close();
  await pgStore.close();
  await raw.close();
  process.stdout.write('\n### audit-query (`npm run bench -- audit-query`)\n');
  process.stdout.write(
    `Conditions: ${conditions(`ClickHouse ${rows.toLocaleString('en')} rows (Debian 18.16), PostgreSQL ${pgRows.toLocaleString('en')} rows; ${ORGS} orgs; page of 100; ${runs} runs each after 3 warm-ups; baseline = the same conditions as one single-pass query by the bare ClickHouse client`, UNPINNED)}\n\n`,
  );
  process.stdout.write(
    table(
      [
        'persona query',
        'rows',
        'ours CH p50',
        'ours CH p99',
        'baseline CH p50',
        'ours/baseline',
        'ours PG p50',
        'ours PG p99',
      ],
      out,
    ) + '\n',
  );
}
