import t from 'tap';
import { execFile } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { insertGrant } from '../../../enclave/broker/operator/grants.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { approvalRequest, satelliteTokenOf } from './approvals-fixture.ts';
import { addAgent } from './secrets-fixture.ts';

// The approval loop on a real broker (TLS, PGlite, a real OIDC issuer): llmproxy's satellite routes
// create, read and cancel approvals; operators list, read, approve and deny them under the enclave's own
// grants, each in their own org only; every change is audited with its actor; bad input is a 400 that
// names the field; state survives a restart. Limits and expiry: approvals-limits.test.ts; the live feed
// and the long-polls: approvals-feed.test.ts.

const PERSONAS = [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'approver-a', org: 'org-a', human: true },
  { clientId: 'auditor-a', org: 'org-a', human: true },
  { clientId: 'member-a', org: 'org-a', human: true },
  { clientId: 'nobody-a', org: 'org-a', human: true },
  { clientId: 'eve-b', org: 'org-b', human: true },
];

const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, PERSONAS);
t.teardown(() => h.close());
const token = await satelliteTokenOf(h);
await addAgent(h, 'agent-1', 'org-a', 'g-1');
await addAgent(h, 'agent-2', 'org-a', null);
await addAgent(h, 'agent-s', 'org-a', null, 'suspended');
await addAgent(h, 'agent-c', 'org-a', null, 'active', true);
await addAgent(h, 'agent-b', 'org-b', null);
for (const [who, role] of [
  ['approver-a', 'approver'],
  ['auditor-a', 'auditor'],
  ['member-a', 'member'],
]) {
  const res = await h.operator('admin-a', 'POST', '/api/v1/grants', { principal: `user:${who}`, role });
  if (res.status !== 201) throw new Error(`grant for ${who}: ${res.status}`);
}
await insertGrant(h.broker.deps.db, { principal: 'user:eve-b', role: 'admin', capability: null, org: 'org-b' });

const create = (body: unknown, bearer: string | null = token) =>
  h.agent('POST', '/v1/satellite/approvals', body, bearer);
const auditOf = (resource: string) => h.audit.filter((r) => r.resource === resource);

t.test('create, read, list, approve, deny: the approvalView, the 409s, the audit', async (t) => {
  const req = approvalRequest('org-a', 'agent-1');
  const made = await create(req);
  t.equal(made.status, 201);
  const id = made.body.id as string;
  t.match(id, /^[A-Za-z0-9_-]+$/);
  t.same(Object.keys(made.body).sort(), [
    'agent_id',
    'agent_name',
    'args_digest',
    'arguments',
    'created_at',
    'decided_at',
    'decided_by',
    'expires_at',
    'id',
    'org_id',
    'policy_version',
    'reason',
    'rule',
    'status',
    'summary',
    'tool',
  ]);
  t.match(made.body, {
    org_id: 'org-a',
    agent_id: 'agent-1',
    agent_name: 'name-agent-1',
    tool: 'transfer_funds',
    arguments: { amount: 500, to: 'acct-9' },
    args_digest: req.args_digest,
    rule: 'payments.rules[0]',
    summary: 'transfers above 100 need a person',
    policy_version: '0123456789abcdef',
    status: 'pending',
    reason: null,
    decided_by: null,
    decided_at: null,
  });
  t.equal(Date.parse(made.body.expires_at) - Date.parse(made.body.created_at), 60_000, 'expires_in_ms from creation');

  // The same call sent again answers the same approval; with other arguments it is a 409.
  const again = await create(req);
  t.equal(again.status, 201);
  t.equal(again.body.id, id, 'a create sent twice finds the first');
  const other = await create({ ...req, args_digest: 'f'.repeat(64) });
  t.equal(other.status, 409);
  t.match(other.body.detail, /another tool, other arguments or another policy version/);

  t.same((await h.agent('GET', `/v1/satellite/approvals/${id}`, undefined, token)).body, made.body);
  t.same((await h.operator('auditor-a', 'GET', `/api/v1/approvals/${id}`)).body, made.body, 'an auditor reads it');

  const second = await create(approvalRequest('org-a', 'agent-2', { arguments: 'not json {', tool: 'rm_rf' }));
  t.equal(second.status, 201);
  t.equal(second.body.arguments, 'not json {', 'arguments that do not parse are the text');

  const list = await h.operator('approver-a', 'GET', '/api/v1/approvals');
  t.equal(list.status, 200);
  t.same(
    list.body.approvals.map((a: { id: string }) => a.id),
    [second.body.id, id],
    'newest first',
  );
  t.equal(list.body.next_offset, 2);
  const byAgent = await h.operator('approver-a', 'GET', '/api/v1/approvals?agent=agent-2&status=pending');
  t.same(
    byAgent.body.approvals.map((a: { id: string }) => a.id),
    [second.body.id],
  );
  const page = await h.operator('approver-a', 'GET', '/api/v1/approvals?limit=1&offset=1');
  t.same(page.body, { approvals: [made.body], next_offset: 2 }, 'paging');

  // Approve, with a reason; then every further decision or cancel is a 409.
  const approved = await h.operator('approver-a', 'POST', `/api/v1/approvals/${id}/approve`, {
    reason: 'ok, expected',
  });
  t.equal(approved.status, 200);
  t.match(approved.body, { id, status: 'approved', reason: 'ok, expected', decided_by: 'approver-a' });
  t.ok(Date.parse(approved.body.decided_at) >= Date.parse(approved.body.created_at));
  for (const [who, path] of [
    ['approver-a', `/api/v1/approvals/${id}/approve`],
    ['admin-a', `/api/v1/approvals/${id}/deny`],
  ]) {
    const res = await h.operator(who, 'POST', path);
    t.equal(res.status, 409, `${path} once approved`);
    t.match(res.type, /^application\/problem\+json/);
    t.match(res.body, {
      type: 'https://dvx.dev/problems/conflict',
      detail: `approval ${id} is approved, no longer pending`,
    });
  }
  t.equal((await h.agent('POST', `/v1/satellite/approvals/${id}/cancel`, undefined, token)).status, 409);
  t.same((await h.operator('admin-a', 'GET', `/api/v1/approvals?status=approved`)).body.approvals, [approved.body]);

  // Deny without a body; the view says who.
  const denied = await h.operator('admin-a', 'POST', `/api/v1/approvals/${second.body.id}/deny`);
  t.equal(denied.status, 200);
  t.match(denied.body, { status: 'denied', reason: null, decided_by: 'admin-a' });

  // Every change audited with its actor, and the broker's audit read route would serve them.
  t.match(auditOf(`approval:${id}`), [
    { action: 'approval.create', actor: 'satellite', actor_kind: 'service', org_id: 'org-a', outcome: 'allow' },
    {
      action: 'approval.approve',
      actor: 'approver-a',
      actor_kind: 'human-operator',
      reason: 'ok, expected',
      attrs: { agent_id: 'agent-1', tool: 'transfer_funds', status: 'approved', args_digest: req.args_digest },
    },
  ]);
  t.equal(auditOf(`approval:${id}`).length, 2, 'the replayed create and the refused decisions changed nothing');
  t.match(auditOf(`approval:${second.body.id}`), [
    { action: 'approval.create', actor: 'satellite' },
    { action: 'approval.deny', actor: 'admin-a' },
  ]);
});

t.test('cancel: by the satellite, once; not after a decision', async (t) => {
  const made = await create(approvalRequest('org-a', 'agent-1'));
  const id = made.body.id;
  const cancelled = await h.agent('POST', `/v1/satellite/approvals/${id}/cancel`, undefined, token);
  t.equal(cancelled.status, 200);
  t.match(cancelled.body, { status: 'cancelled', decided_by: 'satellite' });
  const twice = await h.agent('POST', `/v1/satellite/approvals/${id}/cancel`, {}, token);
  t.equal(twice.status, 200, 'a second cancel answers the same');
  t.same(twice.body, cancelled.body);
  t.equal((await h.operator('admin-a', 'POST', `/api/v1/approvals/${id}/approve`)).status, 409, 'no approving it');
  t.equal((await h.agent('POST', '/v1/satellite/approvals/nope/cancel', undefined, token)).status, 404);
  t.match(auditOf(`approval:${id}`), [
    { action: 'approval.create' },
    { action: 'approval.cancel', actor: 'satellite' },
  ]);
});

t.test('orgs: an operator sees and decides its own org only; another org’s approval is a 404', async (t) => {
  const a = (await create(approvalRequest('org-a', 'agent-1'))).body;
  const b = (await create(approvalRequest('org-b', 'agent-b'))).body;
  t.equal(b.org_id, 'org-b');
  for (const [method, path] of [
    ['GET', `/api/v1/approvals/${a.id}`],
    ['POST', `/api/v1/approvals/${a.id}/approve`],
    ['POST', `/api/v1/approvals/${a.id}/deny`],
  ]) {
    const res = await h.operator('eve-b', method, path);
    t.equal(res.status, 404, `eve (org-b) ${method} ${path}`);
    t.equal(res.body.detail, `no approval ${a.id} in org org-b`, 'the same answer as for no approval at all');
  }
  t.same(
    (await h.operator('eve-b', 'GET', `/api/v1/approvals/does-not-exist`)).body.detail,
    'no approval does-not-exist in org org-b',
  );
  t.same(
    (await h.operator('eve-b', 'GET', '/api/v1/approvals')).body.approvals.map((x: { id: string }) => x.id),
    [b.id],
  );
  t.notOk(
    (await h.operator('admin-a', 'GET', '/api/v1/approvals')).body.approvals.some((x: { id: string }) => x.id === b.id),
  );
  t.equal((await h.operator('admin-a', 'GET', `/api/v1/approvals/${b.id}`)).status, 404);
  t.equal((await h.operator('eve-b', 'POST', `/api/v1/approvals/${b.id}/approve`)).status, 200);
  t.equal((await h.operator('admin-a', 'GET', `/api/v1/approvals/${a.id}`)).body.status, 'pending', 'untouched');
});

t.test('grants: approvals:read to read, approvals:decide to decide', async (t) => {
  const a = (await create(approvalRequest('org-a', 'agent-1'))).body;
  for (const who of ['member-a', 'nobody-a']) {
    const list = await h.operator(who, 'GET', '/api/v1/approvals');
    t.equal(list.status, 403, `${who} cannot list`);
    t.match(list.body.detail, /requires approvals:read over org org-a in this enclave/);
    t.equal((await h.operator(who, 'GET', `/api/v1/approvals/${a.id}`)).status, 403);
    t.equal((await h.operator(who, 'GET', '/api/v1/approvals/stream')).status, 403);
  }
  for (const who of ['member-a', 'nobody-a', 'auditor-a']) {
    const res = await h.operator(who, 'POST', `/api/v1/approvals/${a.id}/approve`, { reason: 'sneaky' });
    t.equal(res.status, 403, `${who} cannot approve`);
    t.match(res.body.detail, /requires approvals:decide/);
    t.equal((await h.operator(who, 'POST', `/api/v1/approvals/${a.id}/deny`)).status, 403, `${who} cannot deny`);
    // The capability comes before the body: a malformed body is still a 403.
    t.equal((await h.operator(who, 'POST', `/api/v1/approvals/${a.id}/deny`, { nope: 1 })).status, 403);
  }
  t.equal((await h.operator(null, 'GET', '/api/v1/approvals')).status, 401, 'no token');
  t.equal((await h.operator(null, 'POST', `/api/v1/approvals/${a.id}/approve`)).status, 401);
  t.equal((await h.operator('admin-a', 'GET', `/api/v1/approvals/${a.id}`)).body.status, 'pending', 'still pending');
  // A capability granted alone works like the role.
  t.equal(
    (
      await h.operator('admin-a', 'POST', '/api/v1/grants', {
        principal: 'user:member-a',
        capability: 'approvals:decide',
      })
    ).status,
    201,
  );
  t.equal((await h.operator('member-a', 'POST', `/api/v1/approvals/${a.id}/deny`, { reason: 'no' })).status, 200);
  // The satellite routes take the satellite token only: an operator's token is a 401 there.
  t.equal((await create(approvalRequest('org-a', 'agent-1'), await h.issuer!.token('admin-a'))).status, 401);
  t.equal((await create(approvalRequest('org-a', 'agent-1'), null)).status, 401);
  t.equal((await h.agent('GET', `/v1/satellite/approvals/${a.id}`, undefined, 'dvxs_wrong')).status, 401);
});

t.test('bad input: every field checked, a 400 naming it; unknown agents, refused agents', async (t) => {
  const base = approvalRequest('org-a', 'agent-2');
  const cases: [string, unknown, RegExp][] = [
    ['an unknown field', { ...base, extra: 1 }, /^extra: unknown field/],
    // fastify's JSON parser refuses a __proto__ key outright (secure-json-parse).
    ['__proto__ as a field', `{"__proto__": {"x": 1}, ${JSON.stringify(base).slice(1)}`, /not valid JSON/],
    ['constructor as a field', { constructor: 'x', ...base }, /^constructor: unknown field/],
    ['no tool', { ...base, tool: undefined }, /^tool: is required/],
    ['a tool of 257 characters', { ...base, tool: 'x'.repeat(257) }, /^tool: /],
    ['a tool with a zero-width space', { ...base, tool: 'transfer\u200bfunds' }, /^tool: must be visible characters/],
    ['a request_id with a newline', { ...base, request_id: 'a\nb' }, /^request_id: /],
    [
      'a summary with a bidi override',
      { ...base, summary: 'safe \u202egnp.exe' },
      /^summary: must not contain control/,
    ],
    ['arguments past 16 KiB', { ...base, arguments: 'x'.repeat(16 * 1024 + 1) }, /^arguments: /],
    [
      'arguments past 16 KiB in bytes',
      { ...base, arguments: 'é'.repeat(8 * 1024 + 1) },
      /^arguments: must be at most 16384 bytes/,
    ],
    ['arguments not a string', { ...base, arguments: { a: 1 } }, /^arguments: must be a string/],
    ['a digest not SHA-256 hex', { ...base, args_digest: 'abc' }, /^args_digest: must be 64 lowercase hex digits/],
    ['a policy version not hex', { ...base, policy_version: 'v1' }, /^policy_version: must be 16 to 64/],
    [
      'expires_in_ms under 1 s',
      { ...base, expires_in_ms: 999 },
      /^expires_in_ms: must be an integer from 1000 to 86400000/,
    ],
    ['expires_in_ms past 24 h', { ...base, expires_in_ms: 86_400_001 }, /^expires_in_ms: /],
    ['expires_in_ms a fraction', { ...base, expires_in_ms: 1500.5 }, /^expires_in_ms: /],
    ['expires_in_ms a string', { ...base, expires_in_ms: '60000' }, /^expires_in_ms: /],
    ['a body that is an array', [base], /^body: must be a JSON object/],
  ];
  for (const [what, body, detail] of cases) {
    const res = await create(body);
    t.equal(res.status, 400, what);
    t.match(res.body.detail, detail, what);
  }
  t.equal((await create('{"not json')).status, 400, 'malformed JSON');
  t.equal((await create({ ...base, arguments: 'é'.repeat(8 * 1024) })).status, 201, '16 KiB exactly is fine');

  const unknown = await create(approvalRequest('org-a', 'agent-zzz'));
  t.equal(unknown.status, 404);
  t.equal(unknown.body.detail, 'this enclave runs no agent agent-zzz in org org-a');
  t.equal((await create(approvalRequest('org-a', 'agent-b'))).status, 404, "another org's agent");
  for (const agent of ['agent-s', 'agent-c']) {
    const res = await create(approvalRequest('org-a', agent));
    t.equal(res.status, 403, `${agent} is refused`);
    t.match(res.body.detail, /is (suspended|contained): no approval is requested for it/);
  }
  t.ok(h.audit.some((r) => r.action === 'approval.create' && r.outcome === 'deny' && r.resource === 'agent:agent-s'));

  for (const q of ['wait=31', 'wait=-1', 'wait=abc', 'wait=1e3', 'other=1']) {
    const res = await h.agent('GET', `/v1/satellite/approvals/x?${q}`, undefined, token);
    t.equal(res.status, 400, q);
  }
  t.equal((await h.agent('GET', '/v1/satellite/approvals/nope', undefined, token)).status, 404);
  t.equal((await h.agent('GET', `/v1/satellite/approvals/${'x'.repeat(90)}`, undefined, token)).status, 404);

  const a = (await create(approvalRequest('org-a', 'agent-2'))).body;
  const decide = (body: unknown) => h.operator('admin-a', 'POST', `/api/v1/approvals/${a.id}/deny`, body);
  t.match((await decide({ reason: 'x'.repeat(1025) })).body, { status: 400, detail: /^reason: / });
  t.match((await decide({ reason: 'ok', by: 'me' })).body, { status: 400, detail: /^by: unknown field/ });
  t.match((await decide({ reason: 5 })).body, { status: 400, detail: /^reason: must be a string/ });
  t.match((await decide({ reason: 'a\u0007b' })).body, { status: 400, detail: /^reason: must not contain control/ });
  t.match((await decide('[]')).body, { status: 400 });
  for (const q of ['status=maybe', 'limit=0', 'limit=501', 'offset=-1', 'limit=1.5', 'agent=a%20b', 'color=red']) {
    const res = await h.operator('admin-a', 'GET', `/api/v1/approvals?${q}`);
    t.equal(res.status, 400, q);
  }
  const multi = await decide({ reason: 'line one\nline two\ttabbed' });
  t.equal(multi.status, 200, 'line breaks and tabs in a reason are fine');
  t.equal(multi.body.reason, 'line one\nline two\ttabbed');
});

t.test('curl: an operator approves from the command line', async (t) => {
  const a = (await create(approvalRequest('org-a', 'agent-1'))).body;
  const ca = join(h.dir, 'ca.pem');
  await writeFile(ca, h.tls.ca.certPem);
  const { stdout } = await promisify(execFile)('curl', [
    '-sS',
    '--cacert',
    ca,
    '-X',
    'POST',
    `https://127.0.0.1:${h.broker.operatorPort}/api/v1/approvals/${a.id}/approve`,
    '-H',
    `authorization: Bearer ${await h.issuer!.token('approver-a')}`,
    '-H',
    'content-type: application/json',
    '-d',
    '{"reason":"checked with finance"}',
    '-w',
    '\n%{http_code}',
  ]);
  const [body, status] = stdout.split('\n');
  t.equal(status, '200');
  t.match(JSON.parse(body!), {
    id: a.id,
    status: 'approved',
    reason: 'checked with finance',
    decided_by: 'approver-a',
  });
});

t.test('a restart keeps every approval and its status', async (t) => {
  const pending = (await create(approvalRequest('org-a', 'agent-2'))).body;
  const before = (await h.operator('admin-a', 'GET', '/api/v1/approvals?limit=500')).body.approvals;
  await h.broker.close();
  await h.restart();
  const after = (await h.operator('admin-a', 'GET', '/api/v1/approvals?limit=500')).body.approvals;
  t.same(after, before, 'the same approvals, in the same states');
  t.equal((await h.agent('GET', `/v1/satellite/approvals/${pending.id}`, undefined, token)).body.status, 'pending');
  t.equal((await h.operator('approver-a', 'POST', `/api/v1/approvals/${pending.id}/approve`)).status, 200);
});

t.test(
  'an approval whose agent was contained or suspended meanwhile cannot be approved (denied it can be)',
  async (t) => {
    await addAgent(h, 'agent-k', 'org-a', null);
    const states: [[string, boolean], RegExp][] = [
      [['active', true], /^agent agent-k is contained: its held call cannot be approved$/],
      [['suspended', false], /^agent agent-k is suspended: its held call cannot be approved$/],
    ];
    for (const [state, detail] of states) {
      await addAgent(h, 'agent-k', 'org-a', null);
      const a = (await create(approvalRequest('org-a', 'agent-k'))).body;
      t.equal(a.status, 'pending');
      // The control plane contains the agent while a person looks at its held call.
      await addAgent(h, 'agent-k', 'org-a', null, ...state);
      const res = await h.operator('approver-a', 'POST', `/api/v1/approvals/${a.id}/approve`, { reason: 'fine' });
      t.equal(res.status, 409, JSON.stringify(state));
      t.match(res.body.detail, detail);
      t.equal((await h.operator('approver-a', 'GET', `/api/v1/approvals/${a.id}`)).body.status, 'pending');
      t.ok(
        h.audit.some(
          (r) => r.action === 'approval.approve' && r.outcome === 'deny' && r.resource === `approval:${a.id}`,
        ),
        'the refused approve is audited',
      );
      const denied = await h.operator('approver-a', 'POST', `/api/v1/approvals/${a.id}/deny`, { reason: 'contained' });
      t.equal(denied.status, 200, 'a deny is still taken');
      t.equal(denied.body.status, 'denied');
    }
    // Moved to another org, or gone from the enclave: not approvable either.
    await addAgent(h, 'agent-k', 'org-a', null);
    const moved = (await create(approvalRequest('org-a', 'agent-k'))).body;
    await addAgent(h, 'agent-k', 'org-b', null);
    const res = await h.operator('approver-a', 'POST', `/api/v1/approvals/${moved.id}/approve`);
    t.equal(res.status, 409);
    t.match(res.body.detail, /no longer in org org-a/);
    await addAgent(h, 'agent-k', 'org-a', null);
    t.equal(
      (await h.operator('approver-a', 'POST', `/api/v1/approvals/${moved.id}/approve`)).status,
      200,
      'active again',
    );
  },
);

t.test(
  "a create sent again for the same call with another tool is a 409, never the first call's decision",
  async (t) => {
    const req = approvalRequest('org-a', 'agent-1', { tool: 'read_ledger' });
    const made = (await create(req)).body;
    t.equal((await h.operator('approver-a', 'POST', `/api/v1/approvals/${made.id}/approve`)).status, 200);
    // The same request_id, call_id, arguments and policy version, another tool: not the same call.
    const other = await create({ ...req, tool: 'drop_ledger' });
    t.equal(other.status, 409, 'not answered with the approved approval of read_ledger');
    t.match(other.body.detail, /another tool/);
    const again = await create(req);
    t.equal(again.status, 201, 'the same call again: its approval');
    t.match(again.body, { id: made.id, status: 'approved', tool: 'read_ledger' });
  },
);
