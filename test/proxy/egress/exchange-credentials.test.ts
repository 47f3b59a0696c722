import t from 'tap';
import { request } from 'undici';
import type { AuditSink } from '../../../audit-wal/sink.ts';
import { parseInjectRule } from '../../../proxy/egress/inject-cred.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT, AGENT_SECRET, attrsOf, flowOf, GITHUB_TOKEN, ORG_TOKEN, startHarness } from './intercept-harness.ts';

// What the gateway adds to a request: --inject-cred headers (the agent's own replaced, a missing
// secret refused), agent-operator tokens for the control plane, llmproxy's identity headers; each
// authority-gated effect recorded (audit_events) before the request leaves, capture-or-deny enforced.

t.setTimeout(90_000);

const RULES = [
  'host=dest.test,header=Authorization,secret=github_token,format=Bearer {}',
  'host=plain.test,header=X-Plain-Token,secret=github_token',
  'host=other.test,header=X-Api-Token,secret=missing_secret',
  'host=org.test,header=X-Org-Token,secret=org_token',
];
const SECRETS = {
  'agent:agent-1': { db_password: AGENT_SECRET, github_token: GITHUB_TOKEN },
  'org:org-1': { org_token: ORG_TOKEN },
};

/** A sink that makes `audit_events` records durable only after `delayMs` (or never: null), noting when. */
function slowSink(order: string[], delayMs: number | null) {
  return (inner: AuditSink): AuditSink => ({
    append: async (table, record) => {
      if (table !== 'audit_events') return inner.append(table, record);
      order.push(`append ${String(record.action)}`);
      if (delayMs === null) return new Promise<void>(() => {});
      await new Promise((r) => setTimeout(r, delayMs));
      await inner.append(table, record);
      order.push(`durable ${String(record.action)}`);
    },
    flush: () => inner.flush(),
    close: () => inner.close(),
  });
}

t.test(
  '--inject-cred: the header set, the agent own replaced, recorded durably before the request leaves',
  async (t) => {
    const order: string[] = [];
    const h = await startHarness({
      options: { injectCred: RULES },
      secrets: SECRETS,
      audit: slowSink(order, 150),
    });
    t.teardown(() => h.close());
    h.upstream.handle = (req, res) => {
      order.push('upstream');
      // An upstream that echoes the credential: the record must not keep it.
      res.end(`you sent ${req.headers.authorization}`);
    };
    const answer = await request(`https://dest.test:${h.upstream.port}/repos`, {
      dispatcher: h.proxy(),
      headers: { authorization: 'Bearer agent-own-token-1234', 'x-other': 'kept' },
    });
    t.equal(answer.statusCode, 200);
    t.equal(await answer.body.text(), `you sent Bearer ${GITHUB_TOKEN}`, 'the agent gets what the destination said');
    const seen = h.upstream.seen.at(-1)!;
    t.equal(seen.headers.authorization, `Bearer ${GITHUB_TOKEN}`, 'injected');
    t.equal(seen.rawHeaders.filter((n) => n.toLowerCase() === 'authorization').length, 1, 'the agent own is gone');
    t.equal(seen.headers['x-other'], 'kept');
    t.same(order, ['append credential.inject', 'durable credential.inject', 'upstream'], 'durable first, then sent');

    t.ok(await until(() => flowOf(h, '/repos') !== undefined));
    const flow = flowOf(h, '/repos')!;
    const event = h.events().find((e) => e.action === 'credential.inject')!;
    t.match(event, {
      kind: 'event',
      actor: 'agent:agent-1',
      actor_kind: 'agent',
      agent_id: 'agent-1',
      org_id: 'org-1',
      source: 'gateway',
      outcome: 'allow',
      resource: `dest.test:${h.upstream.port}`,
      trace_id: flow.id,
      attrs: { secret: 'github_token', header: 'authorization', flow_id: flow.id },
    });
    const attrs = attrsOf(flow);
    t.equal(attrs.injected_headers, 'authorization');
    t.notMatch(attrs.request_headers, /authorization/i, 'the injected header is not recorded');
    t.equal(attrs.response_body, 'you sent [REDACTED]', 'the credential echoed back is redacted');
    const everything = JSON.stringify(h.audit) + h.logs.join('');
    t.notOk(everything.includes(GITHUB_TOKEN), 'the credential is in no record and no log line');
    t.notOk(everything.includes('agent-own-token-1234'), 'nor the agent own authorization');
  },
);

t.test('a secret of the org is injected; a missing one refuses the request, nothing sent', async (t) => {
  const h = await startHarness({ options: { injectCred: RULES }, secrets: SECRETS });
  t.teardown(() => h.close());
  const org = await request(`https://org.test:${h.upstream.port}/org`, { dispatcher: h.proxy() });
  t.equal(org.statusCode, 200);
  await org.body.text();
  t.equal(h.upstream.seen.at(-1)?.headers['x-org-token'], ORG_TOKEN);

  const before = h.upstream.seen.length;
  const missing = await request(`https://other.test:${h.upstream.port}/missing`, {
    dispatcher: h.proxy(),
    method: 'POST',
    body: 'payload',
  });
  t.equal(missing.statusCode, 403);
  const body = (await missing.body.json()) as { error: { type: string; message: string } };
  t.equal(body.error.type, 'credential_unavailable');
  t.match(body.error.message, /other\.test.*"missing_secret"/, 'names the rule host and the secret name');
  t.equal(h.upstream.seen.length, before, 'the destination saw nothing');
  t.ok(await until(() => flowOf(h, '/missing') !== undefined));
  t.match(flowOf(h, '/missing'), { outcome: 'deny', reason: /credential unavailable/ });
  t.notOk(
    h.events().some((e) => (e.attrs as Record<string, string>).secret === 'missing_secret'),
    'no injection recorded',
  );
});

t.test('plain http: a rule without a port is not sent in clear; one naming the port is', async (t) => {
  const h = await startHarness({ options: { injectCred: RULES }, secrets: SECRETS });
  t.teardown(() => h.close());
  const url = `http://plain.test:${h.plain.port}/clear`;
  const refused = await request(url, { dispatcher: h.proxy({ tunnel: false }) });
  t.equal(refused.statusCode, 403);
  t.match(await refused.body.json(), {
    error: { type: 'credential_unavailable', message: new RegExp(`https only.*port=${h.plain.port}`) },
  });
  t.equal(h.plain.seen.length, 0, 'nothing sent');

  // The operator names the port: plain http is meant.
  h.deps.injectRules = [
    parseInjectRule(`host=plain.test,port=${h.plain.port},header=X-Plain-Token,secret=github_token`),
  ];
  const sent = await request(url, { dispatcher: h.proxy({ tunnel: false }) });
  t.equal(sent.statusCode, 200);
  await sent.body.text();
  t.equal(h.plain.seen.at(-1)?.headers['x-plain-token'], GITHUB_TOKEN);
});

t.test('capture-or-deny: a credential whose record is never durable is not sent (503)', async (t) => {
  const order: string[] = [];
  const h = await startHarness({
    options: { injectCred: RULES, auditCaptureTimeout: 300 },
    secrets: SECRETS,
    audit: slowSink(order, null),
  });
  t.teardown(() => h.close());
  const answer = await request(`https://dest.test:${h.upstream.port}/never`, { dispatcher: h.proxy() });
  t.equal(answer.statusCode, 503);
  t.match(await answer.body.json(), { error: { type: 'audit_unavailable' } });
  t.equal(h.upstream.seen.length, 0, 'nothing sent');
  t.ok(await until(() => flowOf(h, '/never') !== undefined));
  t.match(flowOf(h, '/never'), { outcome: 'deny', reason: /audit unavailable/ });
});

t.test(
  'the control plane: an agent-operator token in place of the agent authorization, its presentation recorded',
  async (t) => {
    const h = await startHarness({ controlPlane: true });
    t.teardown(() => h.close());
    const cp = h.cp!;
    const url = `https://cp.test:${cp.port}/api/v1/agents?page=1`;
    const answer = await request(url, {
      dispatcher: h.proxy(),
      headers: { authorization: 'Bearer whatever-the-agent-had' },
    });
    t.equal(answer.statusCode, 200);
    await answer.body.text();
    const token = `op-token-for-agent-1-0123456789`;
    t.equal(cp.seen.at(-1)?.headers.authorization, `Bearer ${token}`);
    t.equal(cp.seen.at(-1)?.servername, 'cp.test');
    t.ok(await until(() => flowOf(h, '/v1/agents') !== undefined));
    const flow = flowOf(h, '/v1/agents')!;
    t.match(flow, { dst_ip: '127.0.0.1', attrs: { route: 'control-plane', injected_headers: 'authorization' } });
    t.match(
      h.events().find((e) => e.action === 'agent-operator-token.present'),
      { trace_id: flow.id, attrs: { host: 'cp.test' } },
    );
    t.notOk((JSON.stringify(h.audit) + h.logs.join('')).includes(token), 'the token is in no record and no log line');

    h.identity = { ...AGENT, agentId: 'contained-agent' };
    const contained = await request(url, { dispatcher: h.proxy() });
    t.equal(contained.statusCode, 403);
    t.match(await contained.body.json(), { error: { type: 'permission_error', message: /contained/ } });
    h.identity = { ...AGENT, agentId: 'unreachable-agent' };
    const unreachable = await request(url, { dispatcher: h.proxy() });
    t.equal(unreachable.statusCode, 502);
    t.equal(await unreachable.body.text(), 'Upstream request failed');
    t.equal(cp.seen.length, 1, 'neither reached the control plane');
  },
);

t.test(
  'llmproxy: its identity headers, the agent x-dvx-* dropped, not inspected here; down → 502 exactly',
  async (t) => {
    const h = await startHarness({ llmproxy: true });
    t.teardown(() => h.close());
    const llm = h.llm!;
    llm.handle = (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"msg_1"}');
    const body = JSON.stringify({ model: 'claude', messages: [{ role: 'user', content: `pw ${AGENT_SECRET}` }] });
    const answer = await request('https://api.anthropic.com/v1/messages', {
      dispatcher: h.proxy(),
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-dvx-gateway-identity': 'forged-by-the-agent',
        'x-dvx-anything': '1',
        'x-api-key': 'agent-key',
      },
      body,
    });
    t.equal(answer.statusCode, 200);
    t.equal(await answer.body.text(), '{"id":"msg_1"}');
    const seen = llm.seen.at(-1)!;
    t.equal(
      seen.headers['x-dvx-gateway-identity'],
      'signed:agent-1:POST:/v1/messages',
      'the route header, not the forged one',
    );
    t.equal(seen.rawHeaders.filter((n) => n.toLowerCase().startsWith('x-dvx-')).length, 1);
    t.equal(seen.url, '/v1/messages');
    t.equal(seen.body.toString(), body, 'llmproxy inspects its calls itself: the body went on');
    t.ok(await until(() => flowOf(h, '/v1/messages') !== undefined));
    const attrs = attrsOf(flowOf(h, '/v1/messages'));
    t.equal(attrs.route, 'llmproxy');
    t.notMatch(attrs.request_headers, /x-dvx|x-api-key/, 'neither identity header nor key recorded');
    t.notOk(attrs.request_body.includes(AGENT_SECRET), 'the captured body is redacted');

    llm.server.closeAllConnections();
    await new Promise<void>((r) => llm.server.close(() => r()));
    const down = await request('https://api.anthropic.com/v1/messages', {
      dispatcher: h.proxy(),
      method: 'POST',
      body,
    });
    t.equal(down.statusCode, 502);
    t.equal(down.headers['content-type'], 'text/plain; charset=utf-8');
    t.equal(await down.body.text(), 'Upstream request failed');
    t.ok(await until(() => h.flows().some((r) => /llmproxy failed/.test(String(r.reason)))));
  },
);
