import t from 'tap';
import type tap from 'tap';
import { join } from 'node:path';
import pg from 'pg';
import { Agent, request } from 'undici';
import { SseParser, type SseEvent } from '../../core/sse.ts';
import { parseServiceAccountKey, tokenRequestForm } from '../../controlplane/idp/service-account-key.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { AUDIENCE } from '../fixtures/oidc-issuer.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { CHANGES_CHANNEL } from '../../pipeline/policy/store-snapshot.ts';

// Long-lived streams stay authorized only as long as their caller is: real SSE clients on the audit
// tail and the broker events of a real control plane, ended with `event: end` and the reason when
// the grant is deleted, the member offboarded, the service account disabled, the token expires, the
// broker key is rotated — and, for a change this process did not make, by the periodic re-check.
//
// The in-process cases run with the periodic re-check at 10 minutes, so an end seen within a few
// seconds can only come from the change itself.
const h = await startCpHarness([
  { clientId: 'root', org: 'org-a', human: true },
  { clientId: 'alice', org: 'org-a', human: true },
  { clientId: 'bob', org: 'org-a', human: true },
  { clientId: 'carol', org: 'org-a', human: true },
  { clientId: 'dave', org: 'org-z', human: true },
]);
t.teardown(() => h.close());
const dispatcher = new Agent({ connect: { rejectUnauthorized: false } });
t.teardown(() => dispatcher.close());

const cp = await h.start({
  seedAdmin: ['root'],
  auditDsn: `pglite://${join(h.dir, 'audit')}`,
  auditWalDir: join(h.dir, 'wal'),
  auditStreamPollMs: 100,
  agentTokenIssuerUrl: 'https://cp.dvx.test',
  agentTokenTtl: 2_000,
  streamRecheckMs: 600_000,
  tokenEndpointOverride: `${h.issuer.issuer}/token`,
});
let closing: Promise<void> | null = null;
const closeCp = () => (closing ??= cp.close());
t.teardown(closeCp);
const call = (who: string, method: string, path: string, body?: unknown) => h.callAt(cp.port, who, method, path, body);
await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });

/** A real SSE client: every event it receives, and whether the server ended the stream within a bound. */
async function openStream(port: number, path: string, token: string) {
  const controller = new AbortController();
  const res = await request(`https://127.0.0.1:${port}${path}`, {
    dispatcher,
    signal: controller.signal,
    headers: { authorization: `Bearer ${token}` },
  });
  const parser = new SseParser();
  const events: SseEvent[] = [];
  const done = (async () => {
    try {
      for await (const chunk of res.body) events.push(...parser.push(chunk as Buffer));
      events.push(...parser.end());
      return true;
    } catch {
      return false;
    }
  })();
  return {
    status: res.statusCode,
    events,
    /** Waits up to `ms` for the server to end the stream; its final event, or null if it had not. */
    async endedWithin(ms: number): Promise<{ reason: string } | null> {
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        done,
        new Promise<false>((r) => {
          timer = setTimeout(() => r(false), ms);
        }),
      ]);
      clearTimeout(timer);
      if (!ended) {
        controller.abort();
        await done;
        return null;
      }
      const last = events.at(-1);
      return last?.event === 'end' ? JSON.parse(last.data) : { reason: '(no end event)' };
    },
  };
}
const auditStream = async (t: Pick<typeof tap, 'equal'>, token: string) => {
  const s = await openStream(cp.port, '/api/v1/audit/stream', token);
  t.equal(s.status, 200, 'the stream opens');
  return s;
};

t.test('deleting the grant ends the audit tail at once, with the reason', async (t) => {
  const grant = (
    await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:alice', capability: 'audit:read' })
  ).body;
  const s = await auditStream(t, await h.issuer.token('alice'));
  t.equal(await s.endedWithin(300), null, 'it runs while the grant holds');
  const again = await auditStream(t, await h.issuer.token('alice'));
  t.equal((await call('root', 'DELETE', `/orgs/org-a/grants/${grant.id}`)).status, 204);
  t.same(
    await again.endedWithin(5_000),
    { reason: 'grant_revoked' },
    'ended by the change, not by the 10-minute re-check',
  );
  t.equal(
    (
      await h.rawAt(cp.port, 'GET', '/api/v1/audit/stream', undefined, {
        authorization: `Bearer ${await h.issuer.token('alice')}`,
      })
    ).status,
    403,
    'and it cannot be opened again',
  );
  await s.endedWithin(0);
});

t.test('offboarding the member ends her stream', async (t) => {
  await call('root', 'PUT', '/orgs/org-a/members/bob', {});
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:bob', role: 'auditor' });
  const s = await auditStream(t, await h.issuer.token('bob'));
  t.equal((await call('root', 'POST', '/orgs/org-a/members/bob/offboard')).status, 200);
  t.same(await s.endedWithin(5_000), { reason: 'grant_revoked' });
});

t.test('erasing the org ends the streams of its members', async (t) => {
  await call('root', 'POST', '/orgs', { id: 'org-z', name: 'Z' });
  await call('root', 'POST', '/orgs/org-z/grants', { principal: 'user:dave', capability: 'audit:read:all' });
  const s = await auditStream(t, await h.issuer.token('dave'));
  t.equal((await call('root', 'POST', '/orgs/org-z/erasure')).status, 202);
  t.same(await s.endedWithin(10_000), { reason: 'grant_revoked' });
});

t.test('a change of scope ends the stream opened with the old one', async (t) => {
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:carol', capability: 'audit:read' });
  const s = await auditStream(t, await h.issuer.token('carol'));
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:carol', capability: 'audit:read:all' });
  t.same(await s.endedWithin(5_000), { reason: 'scope_changed' }, 'reconnecting gives the new scope');
});

t.test('a token ends its stream at its exp', async (t) => {
  await call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b' });
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'agent:bot-1', role: 'auditor' });
  const minted = (await call('root', 'POST', '/orgs/org-a/agents/bot-1/operator-token')).body;
  t.ok(minted.expires_in <= 2, 'a 2 s agent-operator token');
  const s = await auditStream(t, minted.access_token);
  t.same(await s.endedWithin(15_000), { reason: 'token_expired' });
});

t.test('disabling a service account ends its stream', async (t) => {
  const created = (await call('root', 'POST', '/orgs/org-a/service-accounts', { name: 'tail-bot' })).body;
  await call('root', 'POST', `/orgs/org-a/service-accounts/${created.id}/grants`, { capability: 'audit:read' });
  const form = await tokenRequestForm(parseServiceAccountKey(created.credential), { resource: AUDIENCE, scope: 'api' });
  const token = JSON.parse(
    (
      await h.rawAt(cp.port, 'POST', '/oauth/token', form.toString(), {
        'content-type': 'application/x-www-form-urlencoded',
      })
    ).text,
  ).access_token as string;
  const s = await auditStream(t, token);
  t.equal((await call('root', 'POST', `/orgs/org-a/service-accounts/${created.id}/disable`, {})).status, 200);
  t.same(await s.endedWithin(5_000), { reason: 'account_disabled' });
});

t.test('rotating the broker key ends the broker events stream; the old key is refused after', async (t) => {
  const registered = (await call('root', 'POST', '/enclaves', { name: 'e1', enclave_id: 'enc-1', owning_org: 'org-a' }))
    .body;
  const key = registered.key.token as string;
  const s = await openStream(cp.port, '/v1/broker/events', key);
  t.equal(s.status, 200);
  t.equal(await s.endedWithin(300), null, 'it runs while the key is current');
  const again = await openStream(cp.port, '/v1/broker/events', key);
  t.equal((await call('root', 'POST', '/enclaves/enc-1/broker-key')).status, 201);
  t.same(await again.endedWithin(5_000), { reason: 'key_rotated' });
  t.equal(
    (await h.rawAt(cp.port, 'GET', '/v1/broker/events', undefined, { authorization: `Bearer ${key}` })).status,
    401,
  );
  await s.endedWithin(0);
});

t.test("another replica's change is caught by the periodic re-check", async (t) => {
  const db = await freshPgDatabase('dvx_stream_recheck');
  if (!db) {
    if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
    t.comment('no PostgreSQL: skipped');
    return;
  }
  t.teardown(() => db.drop());
  const other = await h.start({
    seedAdmin: ['root'],
    databaseDsn: db.dsn,
    auditDsn: `pglite://${join(h.dir, 'audit2')}`,
    auditWalDir: join(h.dir, 'wal2'),
    auditStreamPollMs: 100,
    streamRecheckMs: 200,
  });
  t.teardown(() => other.close());
  await h.callAt(other.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  await h.callAt(other.port, 'root', 'POST', '/orgs/org-a/grants', {
    principal: 'user:alice',
    capability: 'audit:read',
  });
  const s = await openStream(other.port, '/api/v1/audit/stream', await h.issuer.token('alice'));
  t.equal(s.status, 200);
  // The grant is deleted behind this control plane's back, as another replica would.
  const client = new pg.Client({ connectionString: db.dsn });
  await client.connect();
  await client.query(`DELETE FROM grants WHERE principal = 'user:alice'`);
  await client.end();
  t.same(await s.endedWithin(20_000), { reason: 'grant_revoked' }, 'within the grant cache TTL and a re-check');
});

t.test("a revocation on another replica reaches this one's open streams through NOTIFY", async (t) => {
  const db = await freshPgDatabase('dvx_stream_notify');
  if (!db) {
    if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
    t.comment('no PostgreSQL: skipped');
    return;
  }
  t.teardown(() => db.drop());
  // Two replicas on one store; the periodic re-check at 10 minutes, so only the nudge can end a stream.
  const replica = (n: number) =>
    h.start({
      seedAdmin: ['root'],
      databaseDsn: db.dsn,
      auditDsn: `pglite://${join(h.dir, `audit-r${n}`)}`,
      auditWalDir: join(h.dir, `wal-r${n}`),
      auditStreamPollMs: 100,
      streamRecheckMs: 600_000,
    });
  const a = await replica(1);
  t.teardown(() => a.close());
  const b = await replica(2);
  t.teardown(() => b.close());
  await h.callAt(a.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  const grant = (
    await h.callAt(a.port, 'root', 'POST', '/orgs/org-a/grants', { principal: 'user:alice', capability: 'audit:read' })
  ).body;
  const first = await openStream(b.port, '/api/v1/audit/stream', await h.issuer.token('alice'));
  t.equal(first.status, 200, "the stream opens on B (its grant cache now holds alice's grant)");
  t.equal(await first.endedWithin(300), null, 'it runs while the grant holds');
  const s = await openStream(b.port, '/api/v1/audit/stream', await h.issuer.token('alice'));
  t.equal((await h.callAt(a.port, 'root', 'DELETE', `/orgs/org-a/grants/${grant.id}`)).status, 204, 'revoked on A');
  t.same(
    await s.endedWithin(3_000),
    { reason: 'grant_revoked' },
    'B ends the stream at once: not the 10-minute re-check, not the 5 s cache',
  );
  const key = (
    await h.callAt(a.port, 'root', 'POST', '/enclaves', { name: 'e-r', enclave_id: 'enc-r', owning_org: 'org-a' })
  ).body.key.token as string;
  const events = await openStream(b.port, '/v1/broker/events', key);
  t.equal(events.status, 200);
  t.equal((await h.callAt(a.port, 'root', 'POST', '/enclaves/enc-r/broker-key')).status, 201, 'the key rotated on A');
  t.same(await events.endedWithin(3_000), { reason: 'key_rotated' }, 'B ends its broker events stream');
});

t.test(
  'a broker events stream whose events cannot be read ends with store_unavailable, counted (not destroyed silently)',
  async (t) => {
    const db = await freshPgDatabase('dvx_stream_store');
    if (!db) {
      if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
      t.comment('no PostgreSQL: skipped');
      return;
    }
    t.teardown(() => db.drop());
    const c = await h.start({
      seedAdmin: ['root'],
      databaseDsn: db.dsn,
      auditDsn: `pglite://${join(h.dir, 'audit-s')}`,
      auditWalDir: join(h.dir, 'wal-s'),
      streamRecheckMs: 600_000,
    });
    t.teardown(() => c.close());
    await h.callAt(c.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
    const key = (
      await h.callAt(c.port, 'root', 'POST', '/enclaves', { name: 'e-s', enclave_id: 'enc-s', owning_org: 'org-a' })
    ).body.key.token as string;
    const s = await openStream(c.port, '/v1/broker/events', key);
    t.equal(s.status, 200);
    // The events table goes away behind the control plane's back; a nudge makes the stream read it.
    const client = new pg.Client({ connectionString: db.dsn });
    await client.connect();
    await client.query('ALTER TABLE events RENAME TO events_gone');
    await client.query(`SELECT pg_notify('${CHANGES_CHANNEL}', '')`);
    await client.end();
    t.same(await s.endedWithin(5_000), { reason: 'store_unavailable' }, 'ended with its reason, not destroyed');
    t.match(
      await c.registry.metrics(),
      /dvx_controlplane_streams_ended_total\{stream="broker_events",reason="store_unavailable"\} 1/,
      'counted',
    );
  },
);

// Last: it stops the control plane the other tests share.
t.test('shutting down ends open streams with their reason', async (t) => {
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:alice', capability: 'audit:read' });
  const s = await auditStream(t, await h.issuer.token('alice'));
  const closed = closeCp();
  t.same(await s.endedWithin(10_000), { reason: 'shutdown' });
  await closed;
});
