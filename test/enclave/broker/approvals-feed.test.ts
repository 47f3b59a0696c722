import t from 'tap';
import { Agent, request } from 'undici';
import { MAX_WAITERS } from '../../../enclave/broker/approvals/waits.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { approvalRequest, openFeed, satelliteTokenOf } from './approvals-fixture.ts';
import { addAgent } from './secrets-fixture.ts';

// The live side of the approval loop: the operators' SSE feed (one `event: approval` per change, `id` a
// rising seq, Last-Event-ID resumes, across a restart too; scoped to the caller's org; ended when the
// caller's grant is revoked or the broker stops) and llmproxy's long-poll (woken at once by a decision,
// answered when the wait ends, bounded, answered at shutdown). Grant re-checks run every 10 minutes
// here: an end seen within seconds comes from the grant change.

const PERSONAS = [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'auditor-a', org: 'org-a', human: true },
  { clientId: 'admin-b', org: 'org-b', human: true },
];
const h = await startBrokerHarness({ seedAdmin: ['admin-a'], streamRecheckMs: 600_000 }, PERSONAS);
t.teardown(() => h.close());
const token = await satelliteTokenOf(h);
await addAgent(h, 'agent-1', 'org-a', null);
await addAgent(h, 'agent-b', 'org-b', null);
const auditorGrant = await h.operator('admin-a', 'POST', '/api/v1/grants', {
  principal: 'user:auditor-a',
  role: 'auditor',
});
await h.broker.deps.db.query(
  `INSERT INTO broker_grants (principal, role, org_id) VALUES ('user:admin-b', 'admin', 'org-b')`,
);
const create = (org = 'org-a', agent = 'agent-1', over: Record<string, unknown> = {}) =>
  h.agent('POST', '/v1/satellite/approvals', approvalRequest(org, agent, over), token);

t.test('the feed: one event per change, in order, org-scoped; Last-Event-ID resumes', async (t) => {
  const feed = await openFeed(h, 'auditor-a');
  t.teardown(() => feed.close());
  const other = await openFeed(h, 'admin-b');
  t.teardown(() => other.close());
  t.equal(feed.status, 200);
  t.match(feed.type, /^text\/event-stream/);

  const a = (await create()).body;
  const b = (await create()).body;
  await create('org-b', 'agent-b');
  const approved = (await h.operator('admin-a', 'POST', `/api/v1/approvals/${a.id}/approve`, { reason: 'fine' })).body;
  const cancelled = (await h.agent('POST', `/v1/satellite/approvals/${b.id}/cancel`, undefined, token)).body;
  t.ok(await until(() => feed.approvals().length === 4), 'four changes of org-a');
  const seen = feed.approvals();
  t.same(
    seen.map((e) => [e.seq === undefined ? null : 'id', e.status]),
    [
      ['id', 'pending'],
      ['id', 'pending'],
      ['id', 'approved'],
      ['id', 'cancelled'],
    ],
  );
  const ids = seen.map((e) => Number(e.seq));
  t.ok(
    ids.every((id, i) => i === 0 || id > ids[i - 1]!),
    'ids rise',
  );
  const { seq: _a, ...approvedEvent } = seen[2]!;
  t.same(approvedEvent, approved, 'the data is the approvalView as of the change');
  const { seq: _b, ...cancelledEvent } = seen[3]!;
  t.same(cancelledEvent, cancelled);
  t.notOk(
    feed.events.some((e) => e.data.includes('agent-b')),
    "nothing of org-b's",
  );
  t.ok(await until(() => other.approvals().length === 1), "org-b's admin sees org-b's");
  t.equal(other.approvals()[0]!.agent_id, 'agent-b');

  // Resumed after the first event: the three after it, nothing twice.
  const resumed = await openFeed(h, 'auditor-a', { 'last-event-id': seen[0]!.seq! });
  t.teardown(() => resumed.close());
  t.ok(await until(() => resumed.approvals().length === 3));
  t.same(
    resumed.approvals().map((e) => e.seq),
    seen.slice(1).map((e) => e.seq),
  );
  // A malformed Last-Event-ID is a 400.
  for (const bad of ['abc', '-1', '1.5', '9'.repeat(20)]) {
    const res = await request(`https://127.0.0.1:${h.broker.operatorPort}/api/v1/approvals/stream`, {
      dispatcher: h.dispatcher,
      headers: { authorization: `Bearer ${await h.issuer!.token('auditor-a')}`, 'last-event-id': bad },
    });
    t.equal(res.statusCode, 400, `Last-Event-ID ${bad}`);
    await res.body.dump();
  }
});

t.test('the feed ends when the caller’s grant is revoked', async (t) => {
  const feed = await openFeed(h, 'auditor-a');
  t.teardown(() => feed.close());
  await create();
  t.ok(await until(() => feed.approvals().length === 1));
  t.equal((await h.operator('admin-a', 'DELETE', `/api/v1/grants/${auditorGrant.body.id}`)).status, 204);
  t.ok(await until(() => feed.ended(), 5000), 'ended within seconds');
  t.match(feed.raw(), /event: end\ndata: \{"reason":"grant_revoked"\}/);
  t.equal(
    (await h.operator('admin-a', 'POST', '/api/v1/grants', { principal: 'user:auditor-a', role: 'auditor' })).status,
    201,
  );
});

t.test('the long-poll: woken by a decision, or answered when the wait ends', async (t) => {
  const a = (await create()).body;
  const start = Date.now();
  const waiting = h.agent('GET', `/v1/satellite/approvals/${a.id}?wait=20`, undefined, token);
  await until(() => h.broker.approvals.waits.size === 1);
  t.equal(h.broker.approvals.waits.size, 1, 'one wait open');
  await new Promise((r) => setTimeout(r, 200));
  await h.operator('admin-a', 'POST', `/api/v1/approvals/${a.id}/deny`, { reason: 'not today' });
  const answer = await waiting;
  t.equal(answer.status, 200);
  t.match(answer.body, { id: a.id, status: 'denied', reason: 'not today', decided_by: 'admin-a' });
  t.ok(Date.now() - start < 3000, `answered at once (${Date.now() - start} ms)`);
  t.equal(h.broker.approvals.waits.size, 0);

  const b = (await create()).body;
  const t0 = Date.now();
  const timedOut = await h.agent('GET', `/v1/satellite/approvals/${b.id}?wait=1.2`, undefined, token);
  t.equal(timedOut.body.status, 'pending', 'still pending when the wait ended');
  t.ok(Date.now() - t0 >= 1100, 'after the wait');
  t.equal((await h.agent('GET', `/v1/satellite/approvals/${b.id}?wait=0`, undefined, token)).body.status, 'pending');
  // A decided one answers at once, whatever the wait.
  const t1 = Date.now();
  t.equal((await h.agent('GET', `/v1/satellite/approvals/${a.id}?wait=30`, undefined, token)).body.status, 'denied');
  t.ok(Date.now() - t1 < 1000);
  // An approval that expires while waited for answers at its expiry.
  const c = (await create('org-a', 'agent-1', { expires_in_ms: 1000 })).body;
  const t2 = Date.now();
  const expired = await h.agent('GET', `/v1/satellite/approvals/${c.id}?wait=10`, undefined, token);
  t.equal(expired.body.status, 'expired');
  t.ok(Date.now() - t2 < 3000, 'at its expiry, not at the end of the wait');
  // A client that leaves frees its wait. (Its own dispatcher, destroyed after: undici keeps an aborted
  // request's connection open for a while, which would hold the broker's shutdown below.)
  const d = (await create()).body;
  const gone = new AbortController();
  const own = new Agent({ connect: { ca: h.tls.ca.certPem } });
  const left = request(`https://127.0.0.1:${h.broker.agentPort}/v1/satellite/approvals/${d.id}?wait=30`, {
    dispatcher: own,
    headers: { authorization: `Bearer ${token}` },
    signal: gone.signal,
  }).catch(() => null);
  t.ok(await until(() => h.broker.approvals.waits.size === 1));
  gone.abort();
  await left;
  await own.destroy();
  t.ok(await until(() => h.broker.approvals.waits.size === 0, 3000), 'the wait ends with its caller');
  t.ok(MAX_WAITERS >= 100, 'the bound on waits');
});

t.test('shutdown answers open waits and ends open feeds; a restart resumes the feed', async (t) => {
  const feed = await openFeed(h, 'admin-a');
  const a = (await create()).body;
  t.ok(await until(() => feed.approvals().some((e) => e.id === a.id)));
  const last = feed.approvals().at(-1)!.seq!;
  const waiting = h.agent('GET', `/v1/satellite/approvals/${a.id}?wait=30`, undefined, token);
  await until(() => h.broker.approvals.waits.size === 1);
  const t0 = Date.now();
  await h.broker.close();
  t.ok(Date.now() - t0 < 5000, `closed promptly (${Date.now() - t0} ms)`);
  const answer = await waiting;
  t.equal(answer.status, 200, 'the wait is answered');
  t.equal(answer.body.status, 'pending');
  t.ok(await until(() => feed.ended()));
  t.match(feed.raw(), /event: end\ndata: \{"reason":"shutdown"\}/);

  await h.restart();
  await h.operator('admin-a', 'POST', `/api/v1/approvals/${a.id}/approve`);
  const resumed = await openFeed(h, 'admin-a', { 'last-event-id': last });
  t.teardown(() => resumed.close());
  t.ok(
    await until(() => resumed.approvals().some((e) => e.id === a.id && e.status === 'approved')),
    'the change made after the restart',
  );
  t.ok(
    resumed.approvals().every((e) => Number(e.seq) > Number(last)),
    'nothing from before Last-Event-ID',
  );
});
