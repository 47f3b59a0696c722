import t from 'tap';
import { readFile } from 'node:fs/promises';
import pg from 'pg';
import { createClient } from '@clickhouse/client';
import { newId } from '../../core/ids.ts';
import { openStore, type AuditStore } from '../../audit-wal/store.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// The llm_audit_log record's `inspection_failures` (which inspectors did not finish) reaches both
// stores and comes back from the audit read: in a table created with it, and in a table created
// before the column existed (the additive migration on start), on real PostgreSQL and ClickHouse 18.16.

const FAILURES = [
  { phase: 'request', inspector: 'pii', reason: 'timeout' },
  { phase: 'request', inspector: 'patterns', reason: 'timeout' },
];
const record = () => ({
  id: newId(),
  event_time: new Date().toISOString(),
  org_id: 'org-1',
  agent_id: 'agent-1',
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
  inspection_failopen: true,
  inspection_failures: FAILURES,
  error: null,
});

async function roundTrip(t: { same: (found: unknown, wanted: unknown) => unknown }, store: AuditStore) {
  await store.ensureSchema();
  await store.ensureSchema(); // idempotent, migration included
  const r = record();
  await store.insert('llm_audit_log', [r, { ...record(), inspection_failures: undefined, inspection_failopen: false }]);
  const entries = await store.readLlm({ org: 'org-1', agentId: 'agent-1', limit: 10, offset: 0 });
  t.same(
    entries.map((e) => e.inspection_failures).sort((a, b) => (b as unknown[]).length - (a as unknown[]).length),
    [FAILURES, []],
  );
}

// The llm_audit_log table as the first release created it, without the column.
async function oldTable(dialect: 'postgres' | 'clickhouse'): Promise<string> {
  const sql = await readFile(new URL(`../../deploy/schema/${dialect}.sql`, import.meta.url), 'utf8');
  const create = sql.slice(
    sql.indexOf(
      dialect === 'postgres'
        ? 'CREATE TABLE IF NOT EXISTS llm_audit_log'
        : 'CREATE TABLE IF NOT EXISTS {db}.llm_audit_log',
    ),
  );
  const statement = create.slice(0, create.indexOf(dialect === 'postgres' ? ');' : '\n;') + 2);
  t.match(statement, /inspection_failures/, 'the current schema has the column');
  return statement
    .split('\n')
    .filter((l) => !l.includes('inspection_failures'))
    .join('\n');
}

t.test('PostgreSQL: a new table, and one created before the column', async (t) => {
  for (const existing of [false, true]) {
    const db = await freshPgDatabase('dvx_failures');
    if (!db) return void t.plan(0, 'PostgreSQL not reachable');
    t.teardown(db.drop);
    if (existing) {
      const c = new pg.Client({ connectionString: db.dsn });
      await c.connect();
      await c.query(await oldTable('postgres'));
      await c.end();
    }
    const store = await openStore(db.dsn);
    t.teardown(() => store.close());
    await t.test(existing ? 'migrated table' : 'new table', (t) => roundTrip(t, store));
  }
});

t.test('PGlite: a new table', async (t) => {
  const { mkdtemp, rm } = await import('node:fs/promises');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const dir = await mkdtemp(join(tmpdir(), 'dvx-failures-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const store = await openStore(`pglite://${dir}`);
  t.teardown(() => store.close());
  await roundTrip(t, store);
});

t.test('ClickHouse: a new table, and one created before the column', async (t) => {
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  t.teardown(() => admin.close());
  if (
    !(await admin.ping().then(
      (p) => p.success,
      () => false,
    ))
  ) {
    if (process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123');
    else t.plan(0, 'ClickHouse not running on 127.0.0.1:8123');
    return;
  }
  for (const existing of [false, true]) {
    const db = `dvx_failures_${Date.now().toString(36)}_${existing ? 'old' : 'new'}`;
    t.teardown(() => admin.command({ query: `DROP DATABASE IF EXISTS ${db}` }));
    if (existing) {
      await admin.command({ query: `CREATE DATABASE ${db}` });
      await admin.command({ query: (await oldTable('clickhouse')).replaceAll('{db}', db) });
    }
    const store = await openStore(`clickhouse://default@127.0.0.1:8123/${db}`);
    t.teardown(() => store.close());
    await t.test(existing ? 'migrated table' : 'new table', (t) => roundTrip(t, store));
  }
});
