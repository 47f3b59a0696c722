import t from 'tap';
import { join } from 'node:path';
import pg from 'pg';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { openTls } from '../fixtures/raw-tls.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// The audit tail to a client that stops reading (docs/decisions.md, "Idle connections are reaped"): the stream waits
// for its client (backpressure) instead of buffering every record in memory, and a client that takes nothing
// for --idle-timeout has its stream ended and its connection closed. A slow reader that keeps reading
// gets every record and stays connected. Real TLS clients that pause their socket, a real control
// plane, a real PostgreSQL audit store holding ~32 MB of records; only generous "within" bounds.
const IDLE_MS = 2_000;
const RECORDS = 2_000;
const db = await freshPgDatabase('dvx_stream_stall');
if (!db) {
  if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
  t.comment('no PostgreSQL: skipped');
  process.exit(0);
}
t.teardown(() => db.drop());
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }]);
t.teardown(() => h.close());
const cp = await h.start({
  seedAdmin: ['root'],
  auditDsn: db.dsn,
  auditWalDir: join(h.dir, 'wal'),
  auditStreamPollMs: 100,
  idleTimeout: IDLE_MS,
});
t.teardown(() => cp.close());
await h.callAt(cp.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });

// The backlog, written into the store as the shipper would: 2000 records of 16 KB each.
const since = new Date(Date.now() - 3_600_000);
const client = new pg.Client({ connectionString: db.dsn });
await client.connect();
await client.query(
  `INSERT INTO audit_events (id, event_time, org_id, action, actor, actor_kind, outcome, attrs)
   SELECT 'fill-' || lpad(g::text, 5, '0'), $1::timestamptz + g * interval '1 ms', 'org-a', 'test.fill', 'user:root', 'user', 'allow', jsonb_build_object('pad', repeat('x', 16384))
     FROM generate_series(1, ${RECORDS}) g`,
  [since.toISOString()],
);
await client.end();

const metric = async (re: RegExp) => re.test(await cp.registry.metrics());
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const request = async () =>
  `GET /api/v1/audit/stream?since=${encodeURIComponent(since.toISOString())} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${await h.issuer.token('root')}\r\n\r\n`;

t.test('a client that stops reading the audit tail: its stream ends and its connection is closed', async (t) => {
  const c = await openTls(cp.port, {});
  c.socket.write(await request());
  c.socket.pause();
  let cut = false;
  for (const end = Date.now() + 20_000; !cut && Date.now() < end; await sleep(100)) {
    cut = await metric(
      /dvx_controlplane_streams_ended_total\{stream="audit",reason="client_not_reading"\} [1-9]|dvx_connections_reaped_total\{listener="controlplane",reason="send_stall"\} [1-9]/,
    );
  }
  t.ok(cut, 'the server gave up on the client (counted as a stream ended for not reading, or a send stall)');
  c.socket.resume();
  const r = await c.closed(10_000);
  t.ok(r.closed, 'the client, reading again, finds the connection closed');
  t.ok(
    r.text.length < RECORDS * 16_384,
    `and only part of the backlog had left (${r.text.length} bytes): the rest was never buffered for it`,
  );
});

t.test('a slow reader that keeps reading gets every record and stays connected', async (t) => {
  const c = await openTls(cp.port, {});
  let text = '';
  let got = 0;
  c.socket.on('data', (d: Buffer) => {
    got += d.length;
    text += d.toString('latin1');
    // About 512 KB per turn, a turn every 250 ms: the backlog takes several idle bounds to arrive.
    if (got % (512 * 1024) < d.length) c.socket.pause();
  });
  c.socket.write(await request());
  const turns = setInterval(() => c.socket.resume(), 250);
  const count = () => (text.match(/"action":"test\.fill"/g) ?? []).length;
  for (const end = Date.now() + 90_000; count() < RECORDS && Date.now() < end; ) await sleep(200);
  clearInterval(turns);
  c.socket.resume();
  t.equal(count(), RECORDS, 'every record arrived');
  const r = await c.closed(IDLE_MS * 2);
  t.notOk(r.closed, 'the stream is still open (the client closes it)');
  t.notMatch(text, /event: end/);
});
