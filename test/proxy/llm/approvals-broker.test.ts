import t from 'tap';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createLogger } from '../../../core/logger.ts';
import { ApprovalsClient, type ApprovalRequest } from '../../../proxy/llm/approvals-client.ts';
import { ApprovalRateLimitError, ApprovalsUnavailableError } from '../../../proxy/llm/errors.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';

// llmproxy's approvals client against the real broker (TLS, PGlite, its satellite token file and CA):
// create, a person's approve and deny through the operator routes seen by the long poll, cancel, the
// broker's limits as ApprovalRateLimitError, and the broker's own refusals as ApprovalsUnavailableError.

const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const now = () => performance.now();
const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, [{ clientId: 'admin-a', org: 'org-a', human: true }]);
t.teardown(() => h.close());
await addAgent(h, 'agent-1', 'org-a', null);
await addAgent(h, 'agent-2', 'org-a', null);
const client = await ApprovalsClient.open({
  url: `https://127.0.0.1:${h.broker.agentPort}`,
  tokenFile: join(h.dir, 'state', 'satellite-token'),
  ca: Buffer.from(h.tls.ca.certPem),
  log: quiet,
});
t.teardown(() => client.close());

let n = 0;
const body = (agent = 'agent-1', over: Partial<ApprovalRequest> = {}): ApprovalRequest => {
  const args = JSON.stringify({ amount: 500 + n });
  return {
    request_id: `req-${++n}`,
    call_id: `call-${n}`,
    org_id: 'org-a',
    agent_id: agent,
    agent_name: 'builder',
    model: '',
    tool: 'transfer',
    arguments: args,
    args_digest: sha256(args),
    rule: 'money.rules[0]',
    summary: null,
    policy_version: '0123456789abcdef',
    expires_in_ms: 60_000,
    ...over,
  };
};

t.test('a person approves: the long poll sees it at once, bound to the digest and policy version', async (t) => {
  const req = body();
  const created = await client.create(req);
  t.match(created, { status: 'pending', args_digest: req.args_digest, policy_version: '0123456789abcdef' });
  setTimeout(() => void h.operator('admin-a', 'POST', `/api/v1/approvals/${created.id}/approve`, {}), 200);
  const started = now();
  const view = await client.waitDecided(created.id, now() + 20_000, now);
  t.ok(now() - started < 5000, 'answered when decided, not at the end of the wait');
  t.match(view, { id: created.id, status: 'approved', args_digest: req.args_digest, decided_by: /admin-a/ });
  t.ok(Date.parse(view.decided_at!) <= Date.parse(view.expires_at));
  t.equal(await client.cancel(created.id), null, 'a decided approval is not cancelled (409)');
});

t.test('a person denies with a reason', async (t) => {
  const created = await client.create(body());
  setTimeout(
    () => void h.operator('admin-a', 'POST', `/api/v1/approvals/${created.id}/deny`, { reason: 'not today' }),
    100,
  );
  const view = await client.waitDecided(created.id, now() + 20_000, now);
  t.match(view, { status: 'denied', reason: 'not today', decided_by: /admin-a/ });
});

t.test('cancel a pending approval; an expired one reads as escalation-timeout', async (t) => {
  const created = await client.create(body());
  t.match(await client.cancel(created.id), { status: 'cancelled' });
  const short = await client.create(body('agent-1', { expires_in_ms: 1000 }));
  const view = await client.waitDecided(short.id, now() + 5000, now);
  t.match(view, { status: 'expired', decided_by: 'escalation-timeout' });
});

t.test("the broker's limits are ApprovalRateLimitError; its refusals ApprovalsUnavailableError", async (t) => {
  for (let i = 0; i < 10; i++) await client.create(body('agent-2'));
  await t.rejects(client.create(body('agent-2')), ApprovalRateLimitError);
  await t.rejects(client.create(body('no-such-agent')), { name: 'ApprovalsUnavailableError', message: /404/ });
  await t.rejects(client.create(body('agent-1', { tool: 'has space' })), ApprovalsUnavailableError);
  await t.rejects(client.waitDecided('nope', now() + 2000, now), { message: /404/ });
});
