import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { Agent, request } from 'undici';
import { openStore } from '../../../audit-wal/store.ts';
import { WalSink } from '../../../audit-wal/wal-sink.ts';
import { createLogger } from '../../../core/logger.ts';
import { SseParser, type SseEvent } from '../../../core/sse.ts';
import type { BrokerOptions } from '../../../enclave/broker/options.ts';
import { grantsChanged, insertGrant, onGrantsChanged } from '../../../enclave/broker/operator/grants.ts';
import { startBroker, type RunningBroker } from '../../../enclave/broker/server.ts';
import { until } from '../../fixtures/eventually.ts';
import { startIssuer } from '../../fixtures/oidc-issuer.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';

// The enclave's own audit read API on the broker's operator listener, over each store the enclave's audit
// can ship to (PGlite, PostgreSQL, ClickHouse): the broker's own records (its grant changes, through its
// real WAL and shipper) and the records other components shipped to the same store (the llmproxy's LLM
// calls, lifecycle events, a network flow) are read back under the enclave-local grants only: an admin
// and an auditor see every actor of their org, a member its own records, a caller without a grant is
// refused, and a caller of another org sees nothing of this one. Filters, paging, malformed parameters,
// and the live tail, which ends when the caller's grant is revoked.
//
// Streams run with the periodic re-check at 10 minutes: an end seen within seconds comes from the change.

const dir = await mkdtemp(join(tmpdir(), 'dvx-broker-audit-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const tls = await tlsDir('dvx-broker-audit-tls-');
t.teardown(() => tls.remove());
const dispatcher = new Agent({ connect: { ca: tls.ca.certPem } });
t.teardown(() => dispatcher.close());
const issuer = await startIssuer([
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'bob', org: 'org-a', human: true },
  { clientId: 'carol', org: 'org-a', human: true },
  { clientId: 'nobody', org: 'org-a', human: true },
  { clientId: 'eve', org: 'org-b', human: true },
]);
t.teardown(() => issuer.close());
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });

const pgDb = await freshPgDatabase('dvx_broker_audit');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pgDb) t.teardown(() => pgDb.drop());
const chUp = await fetch('http://127.0.0.1:8123/ping').then(
  (r) => r.ok,
  () => false,
);
if (!chUp && process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123');
const chDb = `dvx_broker_audit_${Date.now().toString(36)}`;
if (chUp)
  t.teardown(() =>
    fetch(`http://127.0.0.1:8123/?query=${encodeURIComponent(`DROP DATABASE IF EXISTS ${chDb}`)}`, {
      method: 'POST',
    }).then(() => {}),
  );
const stores: [string, string][] = [
  ['pglite', `pglite://${join(dir, 'audit-pglite')}`],
  ...(pgDb ? [['postgres', pgDb.dsn] as [string, string]] : []),
  ...(chUp ? [['clickhouse', `clickhouse://default@127.0.0.1:8123/${chDb}`] as [string, string]] : []),
];

/**
 * The broker's own store: PostgreSQL where there is one (a fresh database each: a broker starts faster
 * on it than on PGlite), except for the all-PGlite enclave.
 */
async function stateDsn(name: string): Promise<Partial<BrokerOptions>> {
  if (name === 'pglite' || !pgDb) return {};
  const db = await freshPgDatabase('dvx_broker_audit_state');
  if (!db) return {};
  t.teardown(() => db.drop());
  return { databaseDsn: db.dsn };
}

function brokerOptions(name: string, extra: Partial<BrokerOptions> = {}): Partial<BrokerOptions> {
  return {
    addr: '127.0.0.1:0',
    operatorAddr: '127.0.0.1:0',
    tlsCert: tls.cert,
    tlsKey: tls.key,
    stateDir: join(dir, `state-${name}`),
    enclaveId: 'enc-test',
    enclaveName: 'test-enclave',
    localIssuer: issuer.issuer,
    owningOrg: 'org-a',
    seedAdmin: ['admin-a'],
    streamRecheckMs: 600_000,
    ...extra,
  };
}

interface Answer {
  status: number;
  type: unknown;
  body: any;
}
async function call(port: number, who: string | null, method: string, path: string, body?: unknown) {
  const res = await request(`https://127.0.0.1:${port}/api/v1${path}`, {
    method: method as 'GET',
    dispatcher,
    headers: {
      ...(who ? { authorization: `Bearer ${await issuer.token(who)}` } : {}),
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, type: res.headers['content-type'], body: text ? JSON.parse(text) : null } as Answer;
}

/** A real SSE client: every event it receives, and whether the server ended the stream within a bound. */
async function openStream(port: number, who: string, path: string, headers: Record<string, string> = {}) {
  const controller = new AbortController();
  const res = await request(`https://127.0.0.1:${port}/api/v1${path}`, {
    dispatcher,
    signal: controller.signal,
    headers: { authorization: `Bearer ${await issuer.token(who)}`, ...headers },
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
    type: res.headers['content-type'],
    events,
    /** The records received so far (`data` events). */
    records: () => events.filter((e) => e.event === 'message' || !e.event).map((e) => JSON.parse(e.data)),
    /** Waits up to `ms` for the server to end the stream: its final event, or null (then aborted). */
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
    close() {
      controller.abort();
      return done;
    },
  };
}

// What other components of the enclave shipped to the same store before the broker read it: lifecycle
// events and a network flow (audit_events), and the llmproxy's LLM calls (llm_audit_log). Each has its own
// instant, by which the tests name it.
const T0 = Date.parse('2026-11-20T10:00:00.000Z');
const at = (s: number) => new Date(T0 + s * 1000).toISOString();
const EVENTS: Record<string, unknown>[] = [
  {
    id: 'e1',
    event_time: at(1),
    kind: 'event',
    action: 'secret.write',
    actor: 'bob',
    actor_kind: 'human-operator',
    org_id: 'org-a',
    outcome: 'allow',
    resource: 'secret:db-password',
    source: 'broker',
    enclave_id: 'enc-test',
  },
  {
    id: 'e2',
    event_time: at(2),
    kind: 'event',
    action: 'agent.provision',
    actor: 'enclave:enc-test',
    actor_kind: 'service',
    agent_id: 'bot-1',
    org_id: 'org-a',
    outcome: 'allow',
    source: 'broker',
  },
  {
    id: 'e3',
    event_time: at(3),
    kind: 'network_flow',
    action: 'connect',
    agent_id: 'bot-1',
    org_id: 'org-a',
    outcome: 'deny',
    proto: 'tcp',
    dst_host: 'example.com',
    dst_port: 443,
  },
  {
    id: 'e4',
    event_time: at(4),
    kind: 'event',
    action: 'secret.write',
    actor: 'eve',
    actor_kind: 'human-operator',
    org_id: 'org-b',
    outcome: 'allow',
  },
];
const FINDING = {
  inspector_type: 'secrets_filter',
  severity: 'block',
  description: 'secret',
  match: 'hunt****',
  location: 'request_body',
};
const LLM: Record<string, unknown>[] = [
  {
    id: 'l1',
    event_time: at(1.5),
    org_id: 'org-a',
    agent_id: 'bot-1',
    agent_name: 'bot one',
    enclave_id: 'enc-test',
    format: 'anthropic-messages',
    path: '/v1/messages',
    model: 'claude-x',
    status: 403,
    decision: 'block',
    findings: [FINDING],
  },
  {
    id: 'l2',
    event_time: at(2.5),
    org_id: 'org-a',
    agent_id: 'bot-1',
    agent_name: 'bot one',
    enclave_id: 'enc-test',
    format: 'openai-chat',
    path: '/v1/chat/completions',
    model: 'gpt-x',
    status: 200,
    decision: 'allow',
    input_tokens: 12,
    latency_ms: 12.5,
  },
  { id: 'l3', event_time: at(3.5), org_id: 'org-b', agent_id: 'bot-b', agent_name: 'b', status: 200 },
];
const NAMES: Record<string, string> = Object.fromEntries(
  [...EVENTS, ...LLM].map((r) => [r.event_time as string, r.id as string]),
);
/** The seeded records a page holds, by name, in order (the broker's own records have no name). */
const named = (records: Record<string, unknown>[]) => records.map((r) => NAMES[r.event_time as string] ?? '?');
const WINDOW = `since=${encodeURIComponent(at(0))}&until=${encodeURIComponent(at(10))}`;

for (const [name, dsn] of stores) {
  t.test(name, async (t) => {
    const seed = await openStore(dsn);
    await seed.ensureSchema();
    await seed.insert('audit_events', EVENTS);
    await seed.insert('llm_audit_log', LLM);
    // One PGlite instance per directory: the broker opens it next.
    await seed.close();

    const broker: RunningBroker = await startBroker(
      brokerOptions(name, {
        ...(await stateDsn(name)),
        auditDsn: dsn,
        auditWalDir: join(dir, `wal-${name}`),
        auditStreamPollMs: 100,
      }),
      { logger: quiet },
    );
    let closing: Promise<void> | null = null;
    const closeBroker = () => (closing ??= broker.close());
    t.teardown(closeBroker);
    const port = broker.operatorPort;
    const get = (who: string | null, path: string) => call(port, who, 'GET', path);

    // The broker's own records: the admin grants bob `member` and carol `auditor`; each grant.create goes
    // through the broker's WAL and shipper to the store.
    t.equal((await call(port, 'admin-a', 'POST', '/grants', { principal: 'user:bob', role: 'member' })).status, 201);
    const carolGrant = await call(port, 'admin-a', 'POST', '/grants', { principal: 'user:carol', role: 'auditor' });
    t.equal(carolGrant.status, 201);
    let created: Record<string, unknown>[] = [];
    t.ok(
      await until(async () => {
        created = (await get('admin-a', '/audit/events?action=grant.create')).body.records;
        return created.length === 2;
      }),
      'the grant changes reach the store and read back',
    );

    t.test("the broker's own records", async (t) => {
      t.match(created, [
        {
          action: 'grant.create',
          actor: 'admin-a',
          actor_kind: 'human-operator',
          org_id: 'org-a',
          outcome: 'allow',
          source: 'broker',
          enclave_id: 'enc-test',
          enclave_name: 'test-enclave',
          attrs: { principal: 'user:bob', granted: 'member' },
        },
        { action: 'grant.create', attrs: { principal: 'user:carol', granted: 'auditor' } },
      ]);
      t.notOk('id' in created[0]!, 'records are served as AuditRecords');
    });

    t.test('the personas, from the enclave-local grants only', async (t) => {
      const admin = await get('admin-a', `/audit/events?${WINDOW}`);
      t.equal(admin.status, 200);
      t.same(named(admin.body.records), ['e1', 'l1', 'e2', 'l2', 'e3'], 'admin: every actor of its org, in order');
      t.equal(admin.body.next_offset, 5);
      const all = await get('admin-a', '/audit/events');
      t.equal(all.body.records.length, 7, "and the broker's own two");
      t.same(
        named((await get('carol', `/audit/events?${WINDOW}`)).body.records),
        ['e1', 'l1', 'e2', 'l2', 'e3'],
        'auditor: the same',
      );

      // An LLM call the llmproxy shipped reads as an AuditRecord of action inference.request.
      const l1 = admin.body.records[1];
      t.match(l1, {
        action: 'inference.request',
        actor: 'agent:bot-1',
        actor_kind: 'agent',
        agent_id: 'bot-1',
        agent_name: 'bot one',
        org_id: 'org-a',
        enclave_id: 'enc-test',
        outcome: 'deny',
        resource: '/v1/messages',
        source: 'llmproxy',
        event_time: at(1.5),
        attrs: { model: 'claude-x', format: 'anthropic-messages', status: '403', decision: 'block' },
      });
      t.same(JSON.parse(l1.attrs.findings), [FINDING], 'findings as JSON text');
      t.match(admin.body.records[3], {
        outcome: 'allow',
        attrs: { status: '200', input_tokens: '12', latency_ms: '12.5', upstream_status: '' },
      });

      // A member: its own records only, whatever it asks for.
      const bob = await get('bob', '/audit/events');
      t.equal(bob.status, 200);
      t.same(named(bob.body.records), ['e1'], 'member: its own record only');
      t.same((await get('bob', '/audit/events?agent_id=bot-1')).body.records, [], 'no widening by a filter');
      t.same(named((await get('bob', '/audit/events?org=org-b')).body.records), ['e1'], '`org` is ignored');

      const nobody = await get('nobody', '/audit/events');
      t.equal(nobody.status, 403, 'no local audit grant: 403');
      t.match(nobody.type, /^application\/problem\+json/);
      t.match(nobody.body, { status: 403, detail: /audit:read or audit:read:all over org org-a/ });
      t.equal((await get('nobody', '/audit/stream')).status, 403, 'the stream too');
      t.equal((await get(null, '/audit/events')).status, 401, 'no token: 401');

      // Another org's caller: refused without a grant there; with one, it sees its own org and never org-a.
      t.equal((await get('eve', '/audit/events')).status, 403);
      await insertGrant(broker.deps.db, { principal: 'user:eve', role: 'auditor', capability: null, org: 'org-b' });
      t.same(named((await get('eve', `/audit/events?${WINDOW}`)).body.records), ['l3', 'e4']);
      t.same(named((await get('eve', '/audit/events?org=org-a')).body.records), ['l3', 'e4'], 'org-a stays out');
      t.same((await get('eve', '/audit/events?action=grant.create')).body.records, []);
    });

    t.test('filters and paging', async (t) => {
      const q = async (params: string) => {
        const res = await get('admin-a', `/audit/events?${WINDOW}&${params}`);
        t.equal(res.status, 200, params);
        return res.body as { records: Record<string, unknown>[]; next_offset: number };
      };
      const first = await q('limit=2');
      t.same([named(first.records), first.next_offset], [['e1', 'l1'], 2]);
      const second = await q(`limit=2&offset=${first.next_offset}`);
      t.same([named(second.records), second.next_offset], [['e2', 'l2'], 4]);
      const last = await q('limit=2&offset=4');
      t.same([named(last.records), last.next_offset], [['e3'], 5]);
      t.same(named((await q('offset=5')).records), []);
      t.same(named((await q('agent_id=bot-1')).records), ['l1', 'e2', 'l2', 'e3']);
      t.same(named((await q('action=inference.request')).records), ['l1', 'l2']);
      t.same(named((await q('outcome=deny')).records), ['l1', 'e3']);
      t.same(named((await q('actor_kind=human-operator')).records), ['e1']);
      t.same(named((await q('proto=tcp&dst_host=example.com')).records), ['e3'], 'network flows only');
      const span = await get(
        'admin-a',
        `/audit/events?since=${encodeURIComponent(at(2))}&until=${encodeURIComponent(at(3))}`,
      );
      t.same(named(span.body.records), ['e2', 'l2', 'e3'], 'since and until are inclusive');
      t.same(named((await get('bob', `/audit/events?${WINDOW}&action=secret.write`)).body.records), ['e1']);
    });

    t.test('malformed parameters: 400 naming the parameter', async (t) => {
      for (const [params, detail] of [
        ['limit=0', /^limit: must be at least 1/],
        ['limit=abc', /^limit: must be a non-negative integer/],
        ['limit=100000', /^limit: must be at most 1000/],
        ['offset=-1', /^offset: must be a non-negative integer/],
        ['since=yesterday', /^since: must be an RFC 3339 date-time/],
        ['since=2026-02-30T00:00:00Z', /^since: must be an RFC 3339 date-time/],
        [`since=${encodeURIComponent(at(5))}&until=${encodeURIComponent(at(1))}`, /^since: is after until/],
        ['outcome=maybe', /^outcome: must be one of allow, deny/],
        ['actor_kind=robot', /^actor_kind: must be one of/],
        ['action=a&action=b', /^action: given more than once/],
        ['verbose=1', /^verbose: unknown query parameter/],
      ] as const) {
        for (const route of ['/audit/events', '/audit/stream']) {
          const res = await get('admin-a', `${route}?${params}`);
          t.equal(res.status, 400, `${route}?${params}`);
          t.match(res.type, /^application\/problem\+json/);
          t.match(res.body.detail, detail);
        }
      }
      const badCursor = await openStream(port, 'admin-a', '/audit/stream', { 'last-event-id': 'not-a-cursor' });
      t.equal(badCursor.status, 400, 'a Last-Event-ID this stream did not send');
      await badCursor.close();
    });

    t.test('the stream: every record from `since`, resumed after Last-Event-ID', async (t) => {
      const s = await openStream(port, 'admin-a', `/audit/stream?${WINDOW}`);
      t.equal(s.status, 200);
      t.match(s.type, /^text\/event-stream/);
      t.ok(await until(() => s.records().length >= 5), 'the seeded records arrive');
      t.same(named(s.records()), ['e1', 'l1', 'e2', 'l2', 'e3']);
      const cursor = s.events.filter((e) => !e.event || e.event === 'message')[1]!.id!;
      await s.close();
      const resumed = await openStream(port, 'admin-a', `/audit/stream?${WINDOW}`, { 'last-event-id': cursor });
      t.ok(await until(() => resumed.records().length >= 3));
      t.same(named(resumed.records()), ['e2', 'l2', 'e3'], 'after the cursor only');
      await resumed.close();
    });

    t.test("the live tail delivers new records and ends when the caller's grant is revoked", async (t) => {
      const carol = await openStream(port, 'carol', '/audit/stream');
      const bob = await openStream(port, 'bob', '/audit/stream');
      t.equal(carol.status, 200);
      t.equal(bob.status, 200);
      // A record the broker writes: carol (auditor) sees it, bob (member) does not (not his).
      const made = await call(port, 'admin-a', 'POST', '/grants', {
        principal: 'user:nobody',
        capability: 'audit:read',
      });
      t.equal(made.status, 201);
      t.ok(
        await until(() => carol.records().some((r) => r.action === 'grant.create')),
        "the broker's new record reaches the auditor's tail",
      );
      t.match(
        carol.records().find((r) => r.action === 'grant.create'),
        {
          actor: 'admin-a',
          attrs: { principal: 'user:nobody', granted: 'audit:read' },
        },
      );

      // A record another component ships while the tail runs (an LLM call through llmproxy's WAL).
      if (name !== 'pglite') {
        const registry = new Registry();
        const sink = await WalSink.open({
          dir: join(dir, `llmproxy-wal-${name}`),
          dsn,
          log: quiet,
          registry,
          tables: ['llm_audit_log'],
        });
        t.teardown(() => sink.close());
        await sink.append('llm_audit_log', {
          id: `live-${name}`,
          event_time: new Date().toISOString(),
          org_id: 'org-a',
          agent_id: 'bot-2',
          agent_name: 'bot two',
          path: '/v1/messages',
          model: 'claude-live',
          status: 200,
          decision: 'allow',
        });
        t.ok(
          await until(() => carol.records().some((r) => r.action === 'inference.request')),
          'a shipped LLM call reaches the tail',
        );
        t.match(
          carol.records().find((r) => r.action === 'inference.request'),
          {
            actor: 'agent:bot-2',
            attrs: { model: 'claude-live' },
          },
        );
      }

      // Revoking carol's grant ends her tail at once, with the reason; bob's goes on.
      const deleted = await call(port, 'admin-a', 'DELETE', `/grants/${carolGrant.body.id}`);
      t.equal(deleted.status, 204);
      t.same(await carol.endedWithin(10_000), { reason: 'grant_revoked' });
      t.equal(await bob.endedWithin(300), null, "another caller's stream goes on");
      t.same(bob.records(), [], "the member's tail held none of the others' records");
      t.equal((await get('carol', '/audit/events')).status, 403, 'and a new read is refused');
    });

    t.test('shutdown ends an open tail', async (t) => {
      const s = await openStream(port, 'admin-a', '/audit/stream');
      t.equal(s.status, 200);
      const ended = s.endedWithin(10_000);
      await closeBroker();
      t.same(await ended, { reason: 'shutdown' });
    });
  });
}

t.test('without --audit-dsn the audit routes answer a 404 Problem that says why', async (t) => {
  const broker = await startBroker(brokerOptions('no-store', await stateDsn('no-store')), { logger: quiet });
  t.teardown(() => broker.close());
  for (const route of ['/audit/events', '/audit/stream']) {
    const res = await call(broker.operatorPort, 'admin-a', 'GET', route);
    t.equal(res.status, 404, route);
    t.match(res.type, /^application\/problem\+json/);
    t.match(res.body.detail, /no audit store \(--audit-dsn\)/);
    t.equal((await call(broker.operatorPort, null, 'GET', route)).status, 401, 'authentication first');
  }
});

t.test('a grant change wakes the streams of this store only', async (t) => {
  const a = {};
  const b = {};
  let seen = 0;
  const off = onGrantsChanged(a, () => seen++);
  grantsChanged(b);
  t.equal(seen, 0);
  grantsChanged(a);
  t.equal(seen, 1);
  off();
  grantsChanged(a);
  t.equal(seen, 1, 'unsubscribed');
});
