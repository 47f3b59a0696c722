import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { SseParser } from '../../core/sse.ts';
import { openStore, type AuditStore } from '../../audit-wal/store.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// The audit read API on both stores (PostgreSQL and ClickHouse): the persona matrix over seeded
// records (exactly which each persona sees, including attempts to widen with filters), filters,
// malformed parameters, pagination across inserts, the cross-org read record, the live tail with
// resume, and an agent's LLM audit log.
const dir = await mkdtemp(join(tmpdir(), 'dvx-audit-read-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const pgDb = await freshPgDatabase('dvx_audit_read');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pgDb) t.teardown(() => pgDb.drop());
const chUp = await fetch('http://127.0.0.1:8123/ping').then(
  (r) => r.ok,
  () => false,
);
if (!chUp && process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123');
const chDb = `dvx_audit_read_${Date.now().toString(36)}`;
if (chUp)
  t.teardown(() =>
    fetch(`http://127.0.0.1:8123/?query=${encodeURIComponent(`DROP DATABASE IF EXISTS ${chDb}`)}`, {
      method: 'POST',
    }).then(() => {}),
  );
const stores: [string, string][] = [
  ...(pgDb ? [['postgres', pgDb.dsn] as [string, string]] : []),
  ...(chUp ? [['clickhouse', `clickhouse://default@127.0.0.1:8123/${chDb}`] as [string, string]] : []),
];

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'alice', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
    { clientId: 'admin-b', org: 'org-b', human: true },
    { clientId: 'nobody', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const dispatcher = new Agent({ connect: { rejectUnauthorized: false } });
t.teardown(() => dispatcher.close());

const T0 = Date.parse('2026-11-20T10:00:00.000Z');
const at = (s: number) => new Date(T0 + s * 1000).toISOString();
const SEED: Record<string, unknown>[] = [
  {
    id: 'r1',
    event_time: at(1),
    kind: 'event',
    action: 'grant.create',
    actor: 'alice',
    actor_kind: 'human-operator',
    org_id: 'org-a',
    outcome: 'allow',
    scope: 'org:org-a',
  },
  {
    id: 'r2',
    event_time: at(2),
    kind: 'event',
    action: 'agent.create',
    actor: 'admin-a',
    actor_kind: 'human-operator',
    org_id: 'org-a',
    outcome: 'allow',
    attrs: { why: 'x' },
  },
  {
    id: 'r3',
    event_time: at(3),
    kind: 'event',
    action: 'event.purge',
    actor: '',
    actor_kind: '',
    org_id: 'org-a',
    outcome: 'allow',
  },
  {
    id: 'r4',
    event_time: at(4),
    kind: 'event',
    action: 'inference.request',
    actor: 'agent:bot-1',
    actor_kind: 'agent-operator',
    agent_id: 'bot-1',
    org_id: 'org-a',
    outcome: 'deny',
  },
  {
    id: 'r5',
    event_time: at(5),
    kind: 'network_flow',
    action: 'connect',
    agent_id: 'bot-1',
    org_id: 'org-a',
    outcome: 'allow',
    proto: 'tcp',
    dst_host: 'example.com',
    dst_port: 443,
  },
  {
    id: 'r6',
    event_time: at(6),
    kind: 'event',
    action: 'grant.create',
    actor: 'admin-b',
    actor_kind: 'human-operator',
    org_id: 'org-b',
    outcome: 'allow',
  },
  {
    id: 'r7',
    event_time: at(7),
    kind: 'network_flow',
    action: 'connect',
    agent_id: 'bot-b',
    org_id: 'org-b',
    outcome: 'deny',
    proto: 'udp',
    dst_host: 'evil.test',
  },
];

for (const [name, dsn] of stores) {
  t.test(name, async (t) => {
    const store: AuditStore = await openStore(dsn);
    t.teardown(() => store.close());
    await store.ensureSchema();
    await store.insert('audit_events', SEED);
    await store.insert('llm_audit_log', [
      {
        id: 'l1',
        event_time: at(1),
        org_id: 'org-a',
        agent_id: 'bot-1',
        agent_name: 'b',
        format: 'anthropic-messages',
        model: 'claude-x',
        status: 403,
        decision: 'block',
        findings: [
          {
            inspector_type: 'secrets_filter',
            severity: 'block',
            description: 'secret',
            match: 'hunt****',
            location: 'request_body',
          },
        ],
      },
      {
        id: 'l2',
        event_time: at(2),
        org_id: 'org-a',
        agent_id: 'bot-1',
        agent_name: 'b',
        format: 'openai-chat',
        model: 'gpt-x',
        status: 200,
        decision: 'allow',
        findings: [],
      },
      { id: 'l3', event_time: at(3), org_id: 'org-b', agent_id: 'bot-1', agent_name: 'b', status: 200 },
    ]);
    const cp = await h.start(
      {
        seedAdmin: ['root'],
        agentTokenIssuerUrl: 'https://cp.dvx.test',
        auditDsn: dsn,
        auditWalDir: join(dir, `wal-${name}`),
        auditStreamPollMs: 100,
        kmsProvider: 'local',
        kmsConfig: join(dir, `kms-${name}.json`),
      },
      null,
    );
    t.teardown(() => cp.close());
    const call = (who: string, path: string) => h.callAt(cp.port, who, 'GET', path);
    await h.callAt(cp.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
    await h.callAt(cp.port, 'root', 'POST', '/orgs', { id: 'org-b', name: 'B' });
    await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/grants', {
      principal: 'user:alice',
      capability: 'audit:read',
    });
    await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
    await h.callAt(cp.port, 'root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });
    await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/grants', { principal: 'agent:bot-1', role: 'auditor' });
    await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b' });
    const agentToken = (await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/agents/bot-1/operator-token')).body
      .access_token as string;
    const asAgent = async (path: string) => {
      const r = await h.rawAt(cp.port, 'GET', `/api/v1${path}`, undefined, { authorization: `Bearer ${agentToken}` });
      return { status: r.status, body: JSON.parse(r.text) };
    };
    // Only the seeded records (the control plane's own changes are audited into the same table).
    const seeded = (body: { records: { action: string; event_time: string }[] }) =>
      body.records
        .filter((r) => Date.parse(r.event_time) < T0 + 60_000)
        .map((r) => SEED.find((s) => s.event_time === r.event_time && s.action === r.action)?.id);
    const window = `since=${encodeURIComponent(at(0))}&until=${encodeURIComponent(at(59))}`;

    t.test('each persona sees exactly its records; filters never widen', async (t) => {
      t.same(seeded((await call('alice', `/audit/events?${window}`)).body), ['r1'], 'a member: own org, own actor');
      t.same(
        seeded((await call('admin-a', `/audit/events?${window}`)).body),
        ['r1', 'r2', 'r3', 'r4', 'r5'],
        'an org admin: own org, all actors',
      );
      t.same(
        seeded((await call('root', `/audit/events?${window}`)).body),
        ['r1', 'r2', 'r3', 'r4', 'r6'],
        'a platform operator: control-plane events of every org, no network flows',
      );
      t.same(seeded((await call('root', `/audit/events?${window}&org=org-b`)).body), ['r6'], 'narrowed with org');
      t.same(
        seeded((await asAgent(`/audit/events?${window}`)).body),
        ['r4', 'r5'],
        'an agent-operator: records attributed to agent:bot-1',
      );
      t.same(seeded((await call('admin-b', `/audit/events?${window}`)).body), ['r6', 'r7']);
      t.same(
        seeded((await call('admin-b', `/audit/events?${window}&org=org-a`)).body),
        ['r6', 'r7'],
        'org is ignored for an org admin: no widening',
      );
      t.same(seeded((await call('alice', `/audit/events?${window}&actor_kind=human-operator&org=org-b`)).body), ['r1']);
      t.equal((await call('nobody', '/audit/events')).status, 403);
      t.same(
        seeded((await call('admin-a', `/audit/events?${window}&proto=tcp`)).body),
        ['r5'],
        'proto matches network flows only',
      );
      t.same(seeded((await call('admin-a', `/audit/events?${window}&dst_host=example.com`)).body), ['r5']);
      t.same(seeded((await call('admin-a', `/audit/events?${window}&outcome=deny`)).body), ['r4']);
      t.same(seeded((await call('admin-a', `/audit/events?${window}&action=agent.create`)).body), ['r2']);
      t.same(
        seeded(
          (await call('admin-a', `/audit/events?since=${encodeURIComponent(at(2))}&until=${encodeURIComponent(at(3))}`))
            .body,
        ),
        ['r2', 'r3'],
      );
      t.same(seeded((await call('admin-a', `/audit/events?${window}&agent_id=bot-1`)).body), ['r4', 'r5']);
      const r2 = (await call('admin-a', `/audit/events?${window}&action=agent.create`)).body.records[0];
      t.same(Object.keys(r2).sort(), [
        'action',
        'actor',
        'actor_kind',
        'agent_id',
        'agent_name',
        'attrs',
        'dst',
        'dst_host',
        'dst_ip',
        'dst_port',
        'enclave_id',
        'enclave_name',
        'event_time',
        'group_id',
        'identified',
        'namespace',
        'org_id',
        'outcome',
        'proto',
        'reason',
        'resource',
        'scope',
        'security_id',
        'session_id',
        'source',
        'src',
        'src_ip',
        'trace_id',
      ]);
      t.match(r2, { attrs: { why: 'x' }, identified: false, dst_port: null, event_time: at(2) });
    });

    t.test('malformed parameters are 400 problems', async (t) => {
      for (const q of [
        'since=yesterday',
        'until=2026-13-01T00:00:00Z',
        'limit=-1',
        'limit=abc',
        'limit=0',
        'limit=100000',
        'offset=x',
        'outcome=maybe',
        'actor_kind=robot',
        'colour=red',
        'since=2026-11-22T00:00:00Z&until=2026-11-21T00:00:00Z',
        // Year 0000 (and instants outside 0001–9999 once in UTC), a day its month lacks, a NUL in a filter.
        'since=0000-01-01T00:00:00Z',
        'until=0001-01-01T00:30:00%2B01:00',
        'until=9999-12-31T23:59:59-01:00',
        'since=2026-02-30T00:00:00Z',
        'agent_id=bot%001',
        'action=%00',
        'org=org-a%00',
      ]) {
        const r = await call('admin-a', `/audit/events?${q}`);
        t.equal(r.status, 400, q);
        t.equal(r.body.type, 'https://dvx.dev/problems/bad-request');
      }
      const stream = await call('admin-a', '/audit/stream?since=0000-01-01T00:00:00Z');
      t.equal(stream.status, 400, 'the stream too');
      t.match(stream.body.detail, /^since: must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z/);
      t.equal((await call('admin-a', '/audit/stream?dst_host=a%00b')).status, 400);
      const bounds = `since=0001-01-01T00:00:00Z&until=${encodeURIComponent('9999-12-31T23:59:59Z')}`;
      t.same(
        seeded((await call('admin-a', `/audit/events?${bounds}`)).body),
        seeded((await call('admin-a', `/audit/events?${window}`)).body),
        'the widest window still finds every record (ClickHouse clamps it)',
      );
      t.same(
        seeded((await call('admin-a', '/audit/events?since=1900-01-01T00:00:00Z&until=1960-01-01T00:00:00Z')).body),
        [],
        'a window before 1970 finds none',
      );
    });

    t.test('pagination with next_offset, across inserts', async (t) => {
      const first = (await call('admin-a', `/audit/events?${window}&limit=2`)).body;
      t.equal(first.next_offset, 2);
      await store.insert('audit_events', [
        {
          id: 'r8',
          event_time: at(30),
          kind: 'event',
          action: 'late.insert',
          actor: 'admin-a',
          org_id: 'org-a',
          outcome: 'allow',
        },
      ]);
      const ids: string[] = [];
      let offset = 0;
      for (let i = 0; i < 10; i++) {
        const page = (await call('admin-a', `/audit/events?${window}&limit=2&offset=${offset}`)).body;
        ids.push(...page.records.map((r: { action: string }) => r.action));
        if (page.records.length < 2) break;
        offset = page.next_offset;
      }
      t.same(
        ids,
        ['grant.create', 'agent.create', 'event.purge', 'inference.request', 'connect', 'late.insert'],
        'every record once, in order',
      );
    });

    t.test("a platform operator's cross-org read is recorded in that org's view", async (t) => {
      await call('root', `/audit/events?${window}&org=org-b`);
      let found = false;
      for (let i = 0; i < 100 && !found; i++) {
        const page = (await call('admin-b', '/audit/events?action=audit.read')).body;
        found = page.records.some((r: { actor: string; org_id: string }) => r.actor === 'root' && r.org_id === 'org-b');
        if (!found) await new Promise((r) => setTimeout(r, 100));
      }
      t.ok(found, "admin-b sees root's read of org-b");
      const page = (await call('admin-b', '/audit/events?action=audit.read')).body.records.find(
        (r: { actor: string }) => r.actor === 'root',
      );
      t.same(page.attrs, { route: '/api/v1/audit/events', reader_org: 'org-a' }, 'its attributes read in the clear');
      const rawRows = await store.readEvents({
        predicate: { orgs: ['org-b'] },
        filters: { action: 'audit.read' },
        limit: 10,
        offset: 0,
      });
      t.match(rawRows[0].attrs, { sealed: /^enc:v1:/ }, "and are sealed at rest under the org's key");
    });

    t.test('the live tail: same predicate, resumable, nothing missed or repeated', async (t) => {
      const open = async (who: string, last?: string) => {
        const token = await h.issuer.token(who);
        const controller = new AbortController();
        const res = await request(
          `https://127.0.0.1:${cp.port}/api/v1/audit/stream?since=${encodeURIComponent(at(40))}`,
          {
            dispatcher,
            signal: controller.signal,
            headers: { authorization: `Bearer ${token}`, ...(last ? { 'last-event-id': last } : {}) },
          },
        );
        const parser = new SseParser();
        const got: { id?: string; record: { action: string; actor: string } }[] = [];
        const reading = (async () => {
          try {
            for await (const chunk of res.body)
              for (const e of parser.push(chunk as Buffer)) got.push({ id: e.id, record: JSON.parse(e.data) });
          } catch {
            // closed
          }
        })();
        return {
          status: res.statusCode,
          got,
          close: async () => {
            controller.abort();
            await reading;
          },
        };
      };
      const until = async (check: () => boolean) => {
        for (let i = 0; i < 100 && !check(); i++) await new Promise((r) => setTimeout(r, 50));
      };
      const mine = await open('alice');
      t.equal(mine.status, 200);
      const batch = (from: number, n: number, actor: string) =>
        Array.from({ length: n }, (_, i) => ({
          id: `s${from + i}`,
          event_time: at(41 + (from + i) / 1000),
          kind: 'event',
          action: `tail.${from + i}`,
          actor,
          org_id: 'org-a',
          outcome: 'allow',
        }));
      await store.insert('audit_events', [...batch(0, 20, 'alice'), ...batch(100, 5, 'admin-a')]);
      await until(() => mine.got.length >= 20);
      await mine.close();
      t.equal(mine.got.length, 20, 'a member sees only her own');
      t.ok(mine.got.every((e) => e.record.actor === 'alice'));
      const last = mine.got[9].id!;
      // Resume from the tenth: the rest once, then new ones.
      const again = await open('alice', last);
      await store.insert('audit_events', batch(20, 5, 'alice'));
      await until(() => again.got.length >= 15);
      await again.close();
      t.same(
        again.got.map((e) => e.record.action),
        Array.from({ length: 15 }, (_, i) => `tail.${10 + i}`),
        'nothing missed or repeated across the reconnect',
      );
      const bad = await h.rawAt(cp.port, 'GET', '/api/v1/audit/stream', undefined, {
        authorization: `Bearer ${await h.issuer.token('alice')}`,
        'last-event-id': 'garbage',
      });
      t.equal(bad.status, 400);
    });

    t.test("an agent's LLM audit log, with findings", async (t) => {
      const log = (await call('admin-a', '/agents/bot-1/audit-log')).body;
      t.same(
        log.entries.map((e: { id: string }) => e.id),
        ['l1', 'l2'],
        'its org only',
      );
      t.match(log.entries[0], {
        action: 'inference.request',
        model: 'claude-x',
        status: 403,
        outcome: 'deny',
        findings: [{ inspector_type: 'secrets_filter', match: 'hunt****' }],
      });
      t.same(log.entries[1].findings, []);
      t.equal((await asAgent('/agents/bot-1/audit-log')).status, 200, 'the agent-operator reads its own');
      t.equal((await asAgent('/agents/bot-2/audit-log')).status, 403, 'and only its own');
      t.equal((await call('alice', '/agents/bot-1/audit-log')).status, 403, 'a member without audit:read:all');
      t.equal((await call('admin-b', '/agents/bot-1/audit-log')).status, 403);
      t.equal((await asAgent('/orgs/org-a/members')).status, 403, 'its one surface is the audit trail');
    });
  });
}
