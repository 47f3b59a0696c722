import t from 'tap';
import pg from 'pg';
import { openDb } from '../../core/sql.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// A pooled PostgreSQL connection that fails while idle (the server restarted it, the network dropped
// it) is reported to the caller, which logs and counts it (controlplane/server.ts), never swallowed.
const db = await freshPgDatabase('dvx_sql_pool');
if (!db) {
  if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
  t.comment('no PostgreSQL: skipped');
} else {
  t.teardown(() => db.drop());
  t.test('an idle pooled connection that fails is reported, and the pool goes on', async (t) => {
    const errors: Error[] = [];
    const store = await openDb(db.dsn, { onPoolError: (err) => errors.push(err) });
    t.teardown(() => store.close());
    const { rows } = await store.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const admin = new pg.Client({ connectionString: db.dsn });
    await admin.connect();
    await admin.query('SELECT pg_terminate_backend($1)', [rows[0].pid]);
    await admin.end();
    for (let i = 0; i < 100 && errors.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    t.equal(errors.length, 1, 'reported');
    t.ok(errors[0] instanceof Error && errors[0].stack, 'with the error object');
    t.same((await store.query('SELECT 1 AS one')).rows, [{ one: 1 }], 'the next query gets a new connection');
  });
}
