import t from 'tap';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createClient } from '@clickhouse/client';
import { STORE_TABLE } from '../../audit-wal/rows.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { newId } from '../../core/ids.ts';
import { until } from '../fixtures/eventually.ts';

// deploy/schema/clickhouse-cluster.sql against deploy/schema/clickhouse.sql: parsed, every table of the
// single-node schema is a ReplicatedReplacingMergeTree `<name>_local` with the same columns, partition and
// key, under a Distributed table of the name the shipper inserts into. Then on the local ClickHouse
// (Debian's 18.16, one node, no Keeper, so neither ON CLUSTER nor replication can run): the file with ON
// CLUSTER dropped and the Replicated engines made plain, its Distributed tables over the server's own
// one-shard cluster `test_shard_localhost`, and the real WAL sink shipping into it: the rows land in the
// local tables through the Distributed ones, and the store's own schema step changes nothing.

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SINGLE = readFileSync(join(ROOT, 'deploy/schema/clickhouse.sql'), 'utf8');
const CLUSTER = readFileSync(join(ROOT, 'deploy/schema/clickhouse-cluster.sql'), 'utf8');

/** The statements of a schema file: split on lines holding only ";", comments dropped, spaces folded. */
function statements(sql: string): string[] {
  return sql
    .split(/^;\s*$/m)
    .map((s) =>
      s
        .replace(/^--.*$/gm, '')
        .replace(/\s+/g, ' ')
        .trim(),
    )
    .filter(Boolean);
}

interface Table {
  name: string;
  columns: string[];
  engine: string;
  partition?: string;
  order?: string;
  statement: string;
}

function tables(sql: string): Map<string, Table> {
  const out = new Map<string, Table>();
  for (const s of statements(sql)) {
    const m = /^CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS \{db\}\.(\w+)(.*)$/.exec(s);
    if (!m) continue;
    const body = /^[^(]*\((.*)\) ENGINE/.exec(m[2]);
    out.set(m[1], {
      name: m[1],
      columns: body ? body[1].split(',').map((c) => c.trim()) : [],
      engine: /ENGINE = (.*?)(?: PARTITION BY | ORDER BY | POPULATE |$)/.exec(s)?.[1] ?? '',
      partition: /PARTITION BY (\S+)/.exec(s)?.[1],
      order: /ORDER BY (\([^)]*\))/.exec(s)?.[1],
      statement: s,
    });
  }
  return out;
}

const single = tables(SINGLE);
const cluster = tables(CLUSTER);
const BASE = ['llm_audit_log', 'audit_events', 'tool_call_decisions'];

t.test(
  'every table of clickhouse.sql is a replicated local table with the same columns, key and partitions',
  async (t) => {
    t.same([...single.keys()].sort(), ['audit_events', 'audit_events_cp', 'llm_audit_log', 'tool_call_decisions']);
    for (const name of BASE) {
      const a = single.get(name) as Table;
      const local = cluster.get(`${name}_local`);
      t.ok(local, `${name}_local exists`);
      if (!local) continue;
      t.ok(a.columns.length > 10, `${name}: columns parsed`);
      t.same(local.columns, a.columns, `${name}_local: the same columns, types and defaults, in order`);
      t.equal(local.order, a.order, `${name}_local: ORDER BY ${a.order}`);
      t.equal(local.partition, a.partition, `${name}_local: PARTITION BY ${a.partition}`);
      t.equal(
        local.engine,
        `ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/${name}_local', '{replica}')`,
        `${name}_local: replicated per shard, its own Keeper path`,
      );
    }
    const cp = single.get('audit_events_cp') as Table;
    const cpLocal = cluster.get('audit_events_cp_local') as Table;
    t.same(
      cpLocal.columns,
      (single.get('audit_events') as Table).columns,
      "audit_events_cp_local: audit_events' columns",
    );
    t.equal(cpLocal.order, cp.order, 'audit_events_cp_local: the view’s ORDER BY');
    t.match(cp.statement, /SELECT \* FROM \{db\}\.audit_events WHERE kind = 'event'$/);
    t.match(
      cluster.get('audit_events_cp_mv')?.statement ?? '',
      /TO \{db\}\.audit_events_cp_local AS SELECT \* FROM \{db\}\.audit_events_local WHERE kind = 'event'$/,
      "the view fills it from the shard's audit_events_local, with the same filter",
    );
  },
);

t.test('the names the shipper and the reads use are Distributed tables over the local ones', async (t) => {
  const used = new Set([...Object.values(STORE_TABLE), 'audit_events_cp']);
  for (const name of used) {
    const d = cluster.get(name);
    t.ok(d, `${name} exists`);
    t.match(
      d?.statement ?? '',
      new RegExp(`ON CLUSTER \\{cluster\\} AS \\{db\\}\\.${name}_local ENGINE`),
      `${name}: AS ${name}_local`,
    );
    t.equal(d?.engine, `Distributed({cluster}, {db}, ${name}_local, cityHash64(org_id))`, `${name}: sharded by org`);
  }
  for (const s of statements(CLUSTER)) t.match(s, / ON CLUSTER \{cluster\}/, `ON CLUSTER: ${s.slice(0, 60)}…`);
});

/** The cluster file as one node without Keeper runs it: no ON CLUSTER, plain engines, a local cluster. */
function singleNode(sql: string, db: string): string[] {
  return statements(sql).map((s) =>
    s
      .replaceAll(' ON CLUSTER {cluster}', '')
      .replace(/ReplicatedReplacingMergeTree\([^)]*\)/g, 'ReplacingMergeTree()')
      .replaceAll('{cluster}', 'test_shard_localhost')
      .replaceAll('{db}', db),
  );
}

async function clickhouseUp(): Promise<boolean> {
  const c = createClient({ url: 'http://127.0.0.1:8123' });
  try {
    return (await c.ping()).success;
  } finally {
    await c.close();
  }
}

t.test('on a real ClickHouse: the shipper writes through the Distributed tables', async (t) => {
  if (!(await clickhouseUp().catch(() => false))) {
    if (process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123 (.ci/run starts it)');
    else t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
    return;
  }
  const db = `dvx_cluster_${Date.now().toString(36)}`;
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  const dir = await mkdtemp(join(tmpdir(), 'dvx-ch-cluster-'));
  t.teardown(async () => {
    await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
    await admin.close();
    await rm(dir, { recursive: true, force: true });
  });
  for (const s of singleNode(CLUSTER, db)) await admin.command({ query: s });
  const list = async () =>
    (
      await (
        await admin.query({
          query: `SELECT name, engine FROM system.tables WHERE database = '${db}' ORDER BY name`,
          format: 'JSONEachRow',
        })
      ).json<{ name: string; engine: string }>()
    ).map((r) => `${r.name}:${r.engine}`);
  const before = await list();
  t.same(before, [
    'audit_events:Distributed',
    'audit_events_cp:Distributed',
    'audit_events_cp_local:ReplacingMergeTree',
    'audit_events_cp_mv:MaterializedView',
    'audit_events_local:ReplacingMergeTree',
    'llm_audit_log:Distributed',
    'llm_audit_log_local:ReplacingMergeTree',
    'tool_call_decisions:Distributed',
    'tool_call_decisions_local:ReplacingMergeTree',
  ]);

  const sink = await WalSink.open({
    dir,
    dsn: `clickhouse://default@127.0.0.1:8123/${db}`,
    log: createLogger({ level: 'error', destination: { write: () => {} } }),
    registry: createRegistry(),
    shipper: { idleMs: 50, batchRows: 100, backoffMs: { base: 20, max: 200 } },
  });
  const now = new Date().toISOString();
  for (const org of ['org-a', 'org-b'])
    await sink.append('llm_audit_log', {
      id: newId(),
      event_time: now,
      org_id: org,
      agent_id: 'agent-1',
      path: '/v1/messages',
      status: 200,
      decision: 'allow',
      findings: [],
      inspection_failopen: false,
      inspection_failures: [],
    });
  await sink.append('audit_events', {
    id: newId(),
    event_time: now,
    kind: 'event',
    action: 'grant.create',
    org_id: 'org-a',
  });
  await sink.append('audit_events', {
    id: newId(),
    event_time: now,
    kind: 'network_flow',
    org_id: 'org-a',
    dst_port: 443,
  });
  t.ok(
    await until(
      async () =>
        sink.table('llm_audit_log')?.stats().unshippedBytes === 0 &&
        sink.table('audit_events')?.stats().unshippedBytes === 0,
    ),
    'shipped',
  );
  await sink.close();
  t.same(await list(), before, "the store's own schema step (clickhouse.sql, IF NOT EXISTS) changed nothing");
  const count = async (table: string) =>
    (
      await (
        await admin.query({ query: `SELECT count() AS n FROM ${db}.${table}`, format: 'JSONEachRow' })
      ).json<{
        n: string;
      }>()
    )[0].n;
  t.ok(await until(async () => (await count('llm_audit_log_local')) === '2'), 'the LLM calls are in the local table');
  t.equal(await count('audit_events_local'), '2', 'both events in the local table');
  t.equal(await count('audit_events_cp_local'), '1', 'the control-plane event went through the view');
  t.equal(await count('audit_events_cp'), '1', 'and reads back through the Distributed table');
  t.equal(await count('llm_audit_log'), '2', 'the Distributed table reads the shard');
});
