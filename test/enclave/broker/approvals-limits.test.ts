import t from 'tap';
import { APPROVAL_LIMITS } from '../../../enclave/broker/approvals/limits.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { approvalRequest, satelliteTokenOf } from './approvals-fixture.ts';
import { addAgent } from './secrets-fixture.ts';

// The approval limits (10 pending per agent, 100 pending per org, 50 requests per agent per hour: past
// any, 429 `approval rate limit exceeded`), counted atomically so creates racing at a limit never exceed
// it, on PGlite and on PostgreSQL; and expiry: a pending approval past expires_at reads as expired at
// once, cannot be decided, and is marked by the sweeper as `escalation-timeout`. The broker's clock is
// the test's (BrokerStart.now), moved by hand.

let skew = 0;
const now = () => Date.now() + skew;
const PERSONAS = [{ clientId: 'admin-a', org: 'org-a', human: true }];

const pg = await freshPgDatabase('dvx_broker_approvals');
if (!pg && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pg) t.teardown(() => pg.drop());

const pglite = await startBrokerHarness({ seedAdmin: ['admin-a'] }, PERSONAS, { now });
t.teardown(() => pglite.close());
const stores: [string, BrokerHarness][] = [['pglite', pglite]];
if (pg) {
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'], databaseDsn: pg.dsn }, PERSONAS, { now });
  t.teardown(() => h.close());
  stores.push(['postgres', h]);
}

async function setup(h: BrokerHarness, prefix: string, agents: number, org = `org-${prefix}`) {
  const token = await satelliteTokenOf(h);
  const ids = Array.from({ length: agents }, (_, i) => `${prefix}-${i}`);
  for (const id of ids) await addAgent(h, id, org, null);
  const create = (agent: string, over: Record<string, unknown> = {}) =>
    h.agent('POST', '/v1/satellite/approvals', approvalRequest(org, agent, over), token);
  return { token, ids, create };
}

for (const [store, h] of stores) {
  t.test(`${store}: pending per agent, then freed by a decision`, async (t) => {
    const { ids, create, token } = await setup(h, `pa-${store}`, 1);
    const made = [];
    for (let i = 0; i < APPROVAL_LIMITS.pendingPerAgent; i++) {
      const res = await create(ids[0]!);
      t.equal(res.status, 201);
      made.push(res.body.id as string);
    }
    const over = await create(ids[0]!);
    t.equal(over.status, 429, 'the 11th pending approval of one agent');
    t.match(over.type, /^application\/problem\+json/);
    t.match(over.body, { type: 'https://dvx.dev/problems/too-many-requests', detail: 'approval rate limit exceeded' });
    t.ok(
      h.audit.some(
        (r) =>
          r.action === 'approval.create' &&
          r.outcome === 'deny' &&
          r.resource === `agent:${ids[0]}` &&
          r.reason === 'approval rate limit exceeded (10 pending approvals per agent)',
      ),
      'the refusal is audited, naming the limit',
    );
    // A cancelled one frees its place.
    t.equal((await h.agent('POST', `/v1/satellite/approvals/${made[0]}/cancel`, undefined, token)).status, 200);
    t.equal((await create(ids[0]!)).status, 201);
    t.equal((await create(ids[0]!)).status, 429);
  });

  t.test(`${store}: concurrent creates at the limit never exceed it`, async (t) => {
    const { ids, create } = await setup(h, `race-${store}`, 1);
    const answers = await Promise.all(Array.from({ length: 25 }, () => create(ids[0]!)));
    const statuses = answers.map((a) => a.status);
    t.equal(statuses.filter((s) => s === 201).length, APPROVAL_LIMITS.pendingPerAgent, 'exactly 10 made');
    t.equal(statuses.filter((s) => s === 429).length, 25 - APPROVAL_LIMITS.pendingPerAgent, 'the rest refused');
    const { rows } = await h.broker.deps.db.query<{ n: string }>(
      `SELECT count(*) AS n FROM broker_approvals WHERE agent_id = $1 AND status = 'pending'`,
      [ids[0]],
    );
    t.equal(Number(rows[0]!.n), APPROVAL_LIMITS.pendingPerAgent, 'and the store holds exactly 10');
  });

  t.test(`${store}: pending per org, concurrently`, async (t) => {
    // 11 agents: 10 of them fill the org's 100 at 10 each, concurrently with the 11th's creates.
    const { ids, create } = await setup(h, `po-${store}`, 11);
    const answers = await Promise.all(
      ids.flatMap((id) => Array.from({ length: APPROVAL_LIMITS.pendingPerAgent }, () => create(id))),
    );
    t.equal(answers.filter((a) => a.status === 201).length, APPROVAL_LIMITS.pendingPerOrg, 'exactly 100 made');
    t.ok(answers.filter((a) => a.status === 429).every((a) => a.body.detail === 'approval rate limit exceeded'));
    t.equal(answers.filter((a) => a.status === 429).length, 10);
    t.ok(
      h.audit.some((r) => r.outcome === 'deny' && String(r.reason).includes('100 pending approvals per org')),
      'the org limit is the one named',
    );
  });
}

t.test('requests per agent per hour, counted on the broker’s clock', async (t) => {
  const h = pglite;
  const { ids, create, token } = await setup(h, 'hour', 1);
  const cancel = (id: string) => h.agent('POST', `/v1/satellite/approvals/${id}/cancel`, undefined, token);
  for (let i = 0; i < APPROVAL_LIMITS.requestsPerAgentHour; i++) {
    const res = await create(ids[0]!);
    t.equal(res.status, 201, `request ${i + 1}`);
    t.equal((await cancel(res.body.id)).status, 200);
    skew += 60_000; // spread over the hour
    if (i === 9) skew -= 10 * 60_000;
  }
  // 50 made within the last hour (none pending): the 51st is refused.
  skew -= 40 * 60_000;
  const over = await create(ids[0]!);
  t.equal(over.status, 429);
  t.ok(h.audit.some((r) => String(r.reason).includes('50 approval requests per agent per hour')));
  // An hour after the first ones, their places are free again.
  skew += 61 * 60_000;
  t.equal((await create(ids[0]!)).status, 201);
});

t.test('expiry: read as expired at once, no decision after it, swept as escalation-timeout', async (t) => {
  // A broker whose sweeper would not run within the test: it sweeps by hand.
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'], approvalSweepMs: 600_000 }, PERSONAS, { now });
  t.teardown(() => h.close());
  const { ids, create, token } = await setup(h, 'exp', 1, 'org-a');
  const a = (await create(ids[0]!, { expires_in_ms: 5000 })).body;
  const b = (await create(ids[0]!, { expires_in_ms: 5000 })).body;
  t.equal(a.status, 'pending');
  skew += 6000;

  const read = await h.agent('GET', `/v1/satellite/approvals/${a.id}`, undefined, token);
  t.match(read.body, { status: 'expired', decided_by: 'escalation-timeout', decided_at: a.expires_at });
  t.same(
    (await h.operator('admin-a', 'GET', '/api/v1/approvals?status=expired')).body.approvals.map(
      (x: { id: string }) => x.id,
    ),
    [b.id, a.id],
    'listed as expired before the sweeper ran',
  );
  t.same((await h.operator('admin-a', 'GET', '/api/v1/approvals?status=pending')).body.approvals, []);
  const late = await h.operator('admin-a', 'POST', `/api/v1/approvals/${a.id}/approve`);
  t.equal(late.status, 409, 'an approval past expires_at cannot be approved');
  t.equal(late.body.detail, `approval ${a.id} is expired, no longer pending`);
  t.equal((await h.agent('POST', `/v1/satellite/approvals/${a.id}/cancel`, undefined, token)).status, 409);
  // The refused decision marked it (audited as the escalation timeout); the sweeper marks the other.
  t.match(
    h.audit.filter((r) => r.resource === `approval:${a.id}`),
    [
      { action: 'approval.create' },
      {
        action: 'approval.expire',
        actor: 'escalation-timeout',
        actor_kind: 'service',
        reason: 'no decision before expires_at',
      },
    ],
  );
  t.equal(await h.broker.approvals.sweeper.sweep(), 1, 'the sweeper expires the other one');
  t.equal(await h.broker.approvals.sweeper.sweep(), 0, 'and nothing twice');
  t.match(h.audit.filter((r) => r.resource === `approval:${b.id}`).at(-1), {
    action: 'approval.expire',
    actor: 'escalation-timeout',
  });
  const { rows } = await h.broker.deps.db.query<{ status: string; decided_by: string }>(
    'SELECT status, decided_by FROM broker_approvals WHERE id = ANY($1) ORDER BY id',
    [[a.id, b.id]],
  );
  t.same(
    rows.map((r) => [r.status, r.decided_by]),
    [
      ['expired', 'escalation-timeout'],
      ['expired', 'escalation-timeout'],
    ],
  );
  // Expired ones do not count as pending.
  for (let i = 0; i < APPROVAL_LIMITS.pendingPerAgent; i++) t.equal((await create(ids[0]!)).status, 201);
});

t.test('the running sweeper expires what is due within about a second', async (t) => {
  const { ids, create } = await setup(pglite, 'sweep', 1);
  const a = (await create(ids[0]!, { expires_in_ms: 1000 })).body;
  skew += 1500;
  const start = Date.now();
  for (;;) {
    const row = await pglite.broker.deps.db.query<{ status: string }>(
      'SELECT status FROM broker_approvals WHERE id = $1',
      [a.id],
    );
    if (row.rows[0]!.status === 'expired') break;
    if (Date.now() - start > 5000) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.ok(Date.now() - start < 5000, 'swept');
});
