import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { newId } from '../../core/ids.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { AuditFlushTimeoutError } from '../../audit-wal/errors.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { startTcpProxy } from '../fixtures/tcp-proxy.ts';

// shipped() resolves only once every record durable when it was called is in the store: erasure waits for it
// before it sweeps the audit store, so a record of the org still in the WAL cannot ship after the sweep
// (it did, under load: erasure called flush(), which returns at once). A store that stays down makes it throw.

const quiet = createLogger({ level: 'error', destination: { write: () => {} } });

t.test('shipped() waits for the store, and gives up past its bound while the store is down', async (t) => {
  const pgdb = await freshPgDatabase('dvx_flush');
  if (!pgdb) return t.plan(0, 'PostgreSQL not reachable');
  t.teardown(pgdb.drop);
  const dir = await mkdtemp(join(tmpdir(), 'dvx-flush-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const relay = await startTcpProxy(5432);
  t.teardown(() => relay.close());
  const dsn = pgdb.dsn.replace('127.0.0.1:5432', `127.0.0.1:${relay.port}`);
  const sink = await WalSink.open({
    dir,
    dsn,
    log: quiet,
    registry: createRegistry(),
    tables: ['audit_events'],
    shipper: { idleMs: 5000, backoffMs: { base: 20, max: 200 } },
  });
  t.teardown(() => sink.close());
  const count = async () => {
    const c = new pg.Client({ connectionString: pgdb.dsn });
    await c.connect();
    try {
      return Number((await c.query(`SELECT count(*)::int AS n FROM audit_events WHERE org_id = 'org-x'`)).rows[0].n);
    } finally {
      await c.end();
    }
  };
  const event = () => ({
    id: newId(),
    event_time: new Date().toISOString(),
    kind: 'event',
    action: 'config.put',
    actor: 'root',
    org_id: 'org-x',
  });

  await Promise.all(Array.from({ length: 5 }, () => sink.append('audit_events', event())));
  await sink.shipped();
  t.equal(await count(), 5, 'every record durable before the call is in the store when it resolves');

  await relay.cut();
  await Promise.all(Array.from({ length: 3 }, () => sink.append('audit_events', event())));
  await t.rejects(
    sink.shipped(300),
    AuditFlushTimeoutError,
    'a store that stays down: shipped() gives up, it does not pretend',
  );
  await relay.restore();
  await sink.shipped(30_000);
  t.equal(await count(), 8, 'and completes once the store is back');
});
