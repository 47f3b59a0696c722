import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { noneToken, tokenIssuer } from '../../fixtures/agent-identity.ts';
import { baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';

// Every refusal is audited (docs/decisions.md, "Every refusal is audited"): once the caller is known (a token the
// issuer signed, even one refused on a claim), each answer of the proxy's own writes its llm_audit_log record, with
// decision `deny` (or `block` for a policy match) and the reason in `error`. A caller nothing names (no
// credential, a forged or unsigned token) gets no record in any org's log: a log line and a metric.
const h = await startHarness({ proxy: { minTier: 'vm' } });
t.teardown(() => h.close());

const body = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], ...extra });

/** One call; returns its status and the records it added. */
async function refused(path: string, headers: Record<string, string>, payload: string | Buffer = body()) {
  const before = h.audit.length;
  const r = await h.call(path, { headers: { 'content-type': 'application/json', ...headers }, body: payload });
  await until(() => h.proxy.proxy.inFlight === 0); // the call is over, its record appended
  return { status: r.status, text: r.text, records: h.audit.slice(before) };
}

t.test("a token the issuer signed but a claim refuses: 401, recorded as that agent's", async (t) => {
  const now = Math.floor(Date.now() / 1000);
  const cases: [string, string, RegExp][] = [
    ['expired', await h.issuer.mint({}, { issuedAt: now - 400, expiresIn: 300 }), /token expired/],
    ['not yet valid', await h.issuer.mint({}, { notBefore: now + 120 }), /token claim nbf invalid/],
    ['lifetime over 5 minutes', await h.issuer.mint({}, { expiresIn: 3600 }), /token lifetime exceeds 5 minutes/],
  ];
  for (const [name, token, error] of cases) {
    const r = await refused('/v1/messages', { 'x-api-key': token });
    t.equal(r.status, 401, name);
    t.equal(r.records.length, 1, `${name}: one record`);
    t.match(
      r.records[0],
      {
        table: 'llm_audit_log',
        org_id: 'org-1',
        agent_id: 'agent-1',
        status: 401,
        upstream_status: null,
        decision: 'deny',
        error,
      },
      name,
    );
  }
});

t.test("a caller nothing names: 401, logged and counted, in no org's log", async (t) => {
  const stranger = await tokenIssuer('test-key');
  for (const [name, headers] of [
    ['no credential', {}],
    ['unsigned', { authorization: `Bearer ${noneToken()}` }],
    ['forged', { 'x-api-key': await stranger.mint() }],
    ['signed without org_id', { 'x-api-key': await h.issuer.mint({ org_id: undefined }) }],
  ] as [string, Record<string, string>][]) {
    const r = await refused('/v1/messages', headers);
    t.equal(r.status, 401, name);
    t.equal(r.records.length, 0, `${name}: no record`);
  }
  t.ok(
    h.logs.some(
      (l) =>
        l.msg === 'agent authentication failed' &&
        (l.err as { message?: string } | undefined)?.message === 'token signature invalid',
    ),
    'the log line names the reason',
  );
});

t.test("the agent refused: a token org that differs from the snapshot's, and every refusing state", async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { agents: Record<string, unknown> };
  snapshot.agents['agent-s'] = { org_id: 'org-1', name: 's', status: 'suspended', config: {} };
  snapshot.agents['agent-i'] = { org_id: 'org-1', name: 'i', status: 'isolated', config: {} };
  snapshot.agents['agent-c'] = { org_id: 'org-1', name: 'c', status: 'active', contained: true, config: {} };
  await h.writeSnapshot(snapshot);
  const mismatch = await refused('/v1/messages', { 'x-api-key': await h.token({ org_id: 'org-2' }) });
  t.equal(mismatch.status, 403);
  t.equal(mismatch.records.length, 1, 'org mismatch: one record');
  t.match(
    mismatch.records[0],
    {
      org_id: 'org-1',
      agent_id: 'agent-1',
      status: 403,
      decision: 'deny',
      error: 'token org_id "org-2" differs from the agent\'s org in the snapshot',
    },
    'in the log of the org that owns the agent id',
  );
  for (const [sub, error] of [
    ['agent-s', 'agent is suspended'],
    ['agent-i', 'agent is isolated'],
    ['agent-c', 'agent is contained'],
  ]) {
    const r = await refused('/v1/messages', { 'x-api-key': await h.token({ sub }) });
    t.equal(r.status, 403, sub);
    t.match(r.records, [{ org_id: 'org-1', agent_id: sub, status: 403, decision: 'deny', error }], sub);
  }
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('an enclave below --min-tier', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { enclave: Record<string, unknown> };
  snapshot.enclave.isolation_class = 'plain';
  await h.writeSnapshot(snapshot);
  const r = await refused('/v1/messages', { 'x-api-key': await h.token() });
  t.equal(r.status, 403);
  t.match(r.records, [
    { agent_id: 'agent-1', status: 403, decision: 'deny', error: /isolation class plain is below --min-tier vm/ },
  ]);
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('refusals of the request itself: 404, 415, 413, 400, a disallowed model, no credential', async (t) => {
  const token = await h.token();
  const cases: [string, string, Record<string, string>, string | Buffer, number, Record<string, unknown>][] = [
    ['unknown path', '/admin', {}, body(), 404, { decision: 'deny', error: /no such route/ }],
    ['dot segments', '/v1/../admin', {}, body(), 404, { decision: 'deny', error: /no such route/ }],
    [
      'content-type',
      '/v1/messages',
      { 'content-type': 'text/plain' },
      body(),
      415,
      { decision: 'deny', error: /content-type text\/plain/ },
    ],
    [
      'content-encoding',
      '/v1/messages',
      { 'content-encoding': 'gzip' },
      body(),
      415,
      { decision: 'deny', error: /content-encoding gzip/ },
    ],
    [
      'too large',
      '/v1/messages',
      {},
      Buffer.alloc(32 * 1024 * 1024 + 10, 0x61),
      413,
      { decision: 'deny', error: /exceeds 32 MB/ },
    ],
    ['bad shape', '/v1/messages', {}, '[1,2]', 400, { decision: 'deny', error: /./ }],
    [
      'no model',
      '/v1/messages',
      {},
      JSON.stringify({ max_tokens: 8, messages: [] }),
      400,
      { decision: 'deny', error: /model/ },
    ],
    [
      'disallowed model',
      '/v1/messages',
      {},
      body({ model: 'claude-3-opus-preview' }),
      403,
      { decision: 'block', findings: [{ inspector_type: 'model_restriction' }] },
    ],
  ];
  const snapshot = baseSnapshot(h.upstream.url) as { platform: Record<string, unknown> };
  snapshot.platform.model_policy = { value: { mode: 'blocklist', models: ['*-preview'] } };
  await h.writeSnapshot(snapshot);
  for (const [name, path, headers, payload, status, record] of cases) {
    const r = await refused(path, { 'x-api-key': token, ...headers }, payload);
    t.equal(r.status, status, name);
    t.equal(r.records.length, 1, `${name}: one record`);
    t.match(r.records[0], { org_id: 'org-1', agent_id: 'agent-1', status, ...record }, name);
  }
  const none = await refused('/v1/messages', { 'x-api-key': await h.token({ sub: 'agent-unlisted' }) });
  t.equal(none.status, 500);
  t.match(
    none.records,
    [{ agent_id: 'agent-unlisted', status: 500, decision: 'deny', error: /no LLM API credential configured/ }],
    'no credential',
  );
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('audit:llm off: the org asked for no records, refusals included', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { orgs: Record<string, { flags: Record<string, boolean> }> };
  snapshot.orgs['org-1'].flags = { 'audit:llm': false };
  await h.writeSnapshot(snapshot);
  const r = await refused('/admin', { 'x-api-key': await h.token() });
  t.equal(r.status, 404);
  t.equal(r.records.length, 0);
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});
