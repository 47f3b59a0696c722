import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EventHub } from '../../controlplane/events.ts';
import { openDb } from '../../core/sql.ts';
import { migrate } from '../../controlplane/store/migrate.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { controlPlaneMetrics } from '../../controlplane/metrics.ts';
import { announceGrantsChanged } from '../../controlplane/authz/capabilities.ts';

const logs: Record<string, unknown>[] = [];
const registry = createRegistry();
const listenDeps = {
  log: createLogger({ level: 'debug', destination: { write: (s: string) => void logs.push(JSON.parse(s)) } }),
  failures: controlPlaneMetrics(registry).storeConnectionErrors,
};
const until = async (ms: number, ok: () => boolean) => {
  for (const end = Date.now() + ms; !ok() && Date.now() < end; ) await new Promise((r) => setTimeout(r, 20));
  return ok();
};

// The event store: cursors, consumption, the hourly purge; and the wake-up across replicas through
// PostgreSQL LISTEN/NOTIFY (two hubs on two connections, as two control-plane processes would be).
const dir = await mkdtemp(join(tmpdir(), 'dvx-events-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

t.test('since, consumed and purge on PGlite', async (t) => {
  const db = await openDb(`pglite://${join(dir, 'db')}`);
  t.teardown(() => db.close());
  await migrate(db);
  await db.query(`INSERT INTO orgs (id, name, created_by) VALUES ('org-a', 'A', 't')`);
  for (const id of ['enc-1', 'enc-2'])
    await db.query(
      `INSERT INTO enclaves (id, name, owning_org_id, broker_key_hash, created_by) VALUES ($1, $1, 'org-a', $1, 't')`,
      [id],
    );
  const hub = new EventHub();
  await db.transaction(async (tx) => {
    t.equal(await hub.publishTo(tx, { kind: 'org', org: 'org-a' }, 'policy.changed', { n: 1 }), true);
    t.equal(await hub.publish(tx, ['enc-1'], 'agent.created', { n: 2 }), true);
    t.equal(await hub.publish(tx, [], 'nothing', {}), false);
  });
  const enc1 = await hub.since(db, 'enc-1', 0);
  t.same(
    enc1.map((e) => [e.kind, e.payload]),
    [
      ['policy.changed', { n: 1 }],
      ['agent.created', { n: 2 }],
    ],
  );
  t.same(
    (await hub.since(db, 'enc-1', enc1[0].id)).map((e) => e.kind),
    ['agent.created'],
    'after the cursor only',
  );
  t.equal((await hub.since(db, 'enc-2', 0)).length, 1);
  await hub.consumed(db, 'enc-1', enc1[0].id);
  t.equal(await hub.purge(db), 1, 'the consumed one');
  await db.query(`DELETE FROM enclaves WHERE id = 'enc-2'`);
  t.equal(await hub.purge(db), 1, "the deleted enclave's");
  t.same(
    (await hub.since(db, 'enc-1', 0)).map((e) => e.kind),
    ['agent.created'],
    'the unconsumed one stays',
  );
  await hub.close();
});

const pgDb = await freshPgDatabase('dvx_events');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pgDb) {
  t.teardown(() => pgDb.drop());
  t.test('a commit on one replica wakes the other (LISTEN/NOTIFY)', async (t) => {
    const a = await openDb(pgDb.dsn);
    t.teardown(() => a.close());
    await migrate(a);
    await a.query(`INSERT INTO orgs (id, name, created_by) VALUES ('org-a', 'A', 't')`);
    await a.query(
      `INSERT INTO enclaves (id, name, owning_org_id, broker_key_hash, created_by) VALUES ('enc-1', 'e', 'org-a', 'h', 't')`,
    );
    const publisher = new EventHub();
    const replica = new EventHub();
    await replica.listen(pgDb.dsn, listenDeps);
    t.teardown(() => replica.close());
    let woke = 0;
    replica.onWake(() => woke++);
    const tx = a.transaction(async (q) => {
      await publisher.publish(q, ['enc-1'], 'policy.changed', {});
      await new Promise((r) => setTimeout(r, 300));
      t.equal(woke, 0, 'not before the commit');
    });
    await tx;
    for (let i = 0; i < 50 && woke === 0; i++) await new Promise((r) => setTimeout(r, 20));
    t.ok(woke >= 1, 'woken after the commit');
    t.equal((await replica.since(a, 'enc-1', 0)).length, 1);
  });

  t.test('a committed change is announced to every replica; not before its commit, never on rollback', async (t) => {
    const a = await openDb(pgDb.dsn);
    t.teardown(() => a.close());
    const replica = new EventHub();
    await replica.listen(pgDb.dsn, listenDeps);
    t.teardown(() => replica.close());
    let told = 0;
    replica.onAuthzChange(() => told++);
    await a.transaction(async (tx) => {
      await announceGrantsChanged(tx);
      await new Promise((r) => setTimeout(r, 300));
      t.equal(told, 0, 'not before the commit');
    });
    t.ok(await until(2_000, () => told === 1), 'told after the commit');
    await a
      .transaction(async (tx) => {
        await announceGrantsChanged(tx);
        throw new Error('rolled back');
      })
      .catch(() => undefined);
    await new Promise((r) => setTimeout(r, 300));
    t.equal(told, 1, 'a rolled-back change is never announced');
  });

  t.test('a LISTEN connection that fails is logged, counted and reconnected; everyone looks again', async (t) => {
    const a = await openDb(pgDb.dsn);
    t.teardown(() => a.close());
    const replica = new EventHub();
    await replica.listen(pgDb.dsn, listenDeps);
    t.teardown(() => replica.close());
    let told = 0;
    let woke = 0;
    replica.onAuthzChange(() => told++);
    replica.onWake(() => woke++);
    const { rows } = await a.query<{ n: number }>(
      `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`,
    );
    t.ok(rows[0].n >= 1, 'the LISTEN connection is killed');
    t.ok(
      await until(10_000, () => told >= 1 && woke >= 1),
      'once back, the authorization checks and the event handlers look again',
    );
    const failed = logs.find(
      (l) => l.msg === 'the store LISTEN connection failed; reconnecting (changes of other replicas wait until then)',
    );
    t.ok((failed?.err as { stack?: string } | undefined)?.stack, 'logged with the error object');
    t.match(
      await registry.metrics(),
      /dvx_controlplane_store_connection_errors_total\{connection="listen"\} [1-9]/,
      'counted',
    );
    const before = told;
    await a.transaction((tx) => announceGrantsChanged(tx));
    t.ok(await until(5_000, () => told > before), 'and it hears the next change');
  });
}
