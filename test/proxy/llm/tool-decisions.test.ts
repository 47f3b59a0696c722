import t, { type Test } from 'tap';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { readFile } from 'node:fs/promises';
import { createLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import type { AuditSink, AuditTable } from '../../../audit-wal/sink.ts';
import type { EffectiveGovernance, LlmGovernance } from '../../../pipeline/policy/governance.ts';
import { validateSnapshot, type Snapshot } from '../../../pipeline/policy/snapshot.ts';
import { ApprovalsClient } from '../../../proxy/llm/approvals-client.ts';
import { CallContext, type ProxyDeps } from '../../../proxy/llm/context.ts';
import { proxyMetrics } from '../../../proxy/llm/metrics.ts';
import { validateOptions, type LlmProxyOptions } from '../../../proxy/llm/options.ts';
import { secretSource } from '../../../proxy/llm/secrets-file.ts';
import { toolPolicy } from '../../../proxy/llm/steps/tool-policy.ts';
import { toolDecider } from '../../../proxy/llm/tool-decisions.ts';
import { streamToolGate } from '../../../proxy/llm/tools/stream-formats.ts';
import type { Decide, ToolCall } from '../../../proxy/llm/tools/types.ts';
import { startApprovalsPeer, type ApprovalsPeer } from '../../fixtures/approvals-peer.ts';

// The tool-call decision of a call (proxy/llm/tool-decisions.ts) on real parts: a real agent connection
// (node:http, so an agent that leaves is a closed socket), a real TLS approvals peer speaking the
// broker's satellite API, the proxy's metrics registry; each decision's tool_call_decisions row checked.

const SECRET = 'hunter2-agent-secret-value';
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });

const POLICY: LlmGovernance['inspection'] = {
  inspectors: [
    {
      name: 'money',
      rules: [
        {
          tool: 'transfer',
          verdict: 'require_approval',
          summary: 'large transfers need a person',
          arg_gt: { amount: 100 },
        },
        { tool: 'rm_*', verdict: 'deny', summary: 'destructive tools are not allowed' },
        { tool: 'read_*', verdict: 'allow', summary: 'reading is fine' },
      ],
    },
    { rules: [{ tool: 'wire', verdict: 'deny', arg_gt: { 'to.limit': 10 } }] },
  ],
};

/** An audit sink that keeps the rows (the sink is not under test here; tool_call_decisions.test.ts ships them). */
class KeptSink implements AuditSink {
  rows: Record<string, unknown>[] = [];
  hold = false;
  append(table: AuditTable, record: Record<string, unknown>): Promise<void> {
    if (table === 'tool_call_decisions') this.rows.push(record);
    return this.hold ? new Promise(() => {}) : Promise.resolve();
  }
  flush = () => Promise.resolve();
  close = () => Promise.resolve();
}

interface Env {
  deps: ProxyDeps;
  sink: KeptSink;
  registry: ReturnType<typeof createRegistry>;
  /** The snapshot the proxy holds now (the caller's policy when a decision is applied): POLICY's at first. */
  snapshot: Snapshot;
  /** An agent's call held open: its context and a way to make the agent leave. */
  call(governance?: LlmGovernance['inspection'] | null): Promise<{ ctx: CallContext; leave: () => void }>;
}

async function env(
  t: Test,
  o: {
    options?: Partial<LlmProxyOptions>;
    peer?: ApprovalsPeer | null;
    approvalsUrl?: string;
    captureOrDeny?: boolean;
  } = {},
): Promise<Env> {
  const sink = new KeptSink();
  const registry = createRegistry();
  const url = o.approvalsUrl ?? o.peer?.url;
  const approvals = url
    ? await ApprovalsClient.open({
        url,
        tokenFile: o.peer!.tokenFile,
        ca: await readFile(o.peer!.caFile),
        log: quiet,
      })
    : null;
  if (approvals) t.teardown(() => approvals.close());
  const deps = {
    options: validateOptions({
      tlsCert: 'c',
      tlsKey: 'k',
      agentJwks: 'j',
      enclaveId: 'enc-1',
      ...(url ? { approvalsUrl: url, secretBrokerTokenFile: o.peer!.tokenFile } : {}),
      ...o.options,
    }),
    snapshot: () => e.snapshot,
    secrets: secretSource(() => new Map([['agent:agent-1', new Map([['db_password', SECRET]])]])),
    audit: sink,
    approvals,
    log: quiet,
    metrics: proxyMetrics(registry),
    capture: { captureOrDeny: o.captureOrDeny ?? false, timeoutMs: 150 },
    toolDecider,
  } as unknown as ProxyDeps;

  const pending: ((v: { req: IncomingMessage; res: ServerResponse }) => void)[] = [];
  const server = http.createServer((req, res) => pending.shift()!({ req, res }));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  const port = (server.address() as AddressInfo).port;
  const e: Env = {
    deps,
    sink,
    registry,
    snapshot: snapshotOf(POLICY),
    async call(governance = POLICY) {
      const arrived = new Promise<{ req: IncomingMessage; res: ServerResponse }>((r) => pending.push(r));
      const socket = net.connect(port, '127.0.0.1');
      socket.on('error', () => {});
      socket.write('POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n');
      const { req, res } = await arrived;
      t.teardown(() => {
        if (!res.writableEnded) res.end();
        socket.destroy();
      });
      const ctx = new CallContext(deps, req, res, '/v1/messages');
      ctx.identity = {
        agentId: 'agent-1',
        orgId: 'org-1',
        agentName: 'builder',
        groupId: null,
        via: 'jwt',
        tokenHeader: 'authorization',
      };
      ctx.inference = true;
      ctx.model = 'claude-sonnet-4';
      ctx.governance = { llm: { inspection: governance } } as unknown as EffectiveGovernance;
      return { ctx, leave: () => socket.destroy() };
    },
  };
  return e;
}

/** A snapshot whose org-1 holds `inspection` as its llm_policy (agent-1 in it). */
function snapshotOf(
  inspection: LlmGovernance['inspection'] | null,
  agent: { status?: string; contained?: boolean; org_id?: string } = {},
): Snapshot {
  return validateSnapshot({
    version: 'v1',
    enclave: { id: 'enc-1' },
    platform: {},
    orgs: { 'org-1': { config: inspection ? { llm_policy: { value: { inspection } } } : {}, flags: {} } },
    agents: {
      'agent-1': { org_id: 'org-1', name: 'builder', status: 'active', contained: false, config: {}, ...agent },
    },
  });
}

const tc = (name: string, args: unknown, id = `toolu_${name}`, seq = 0): ToolCall => ({
  seq,
  id,
  name,
  arguments: typeof args === 'string' ? args : JSON.stringify(args),
});

async function decider(e: Env, governance?: LlmGovernance['inspection'] | null) {
  const { ctx, leave } = await e.call(governance);
  toolPolicy(ctx);
  return { decide: ctx.decideTool as Decide, ctx, leave };
}

async function counted(e: Env, verdict: string, outcome: string): Promise<number> {
  const m = (await e.registry.getSingleMetric('dvx_llmproxy_tool_decisions_total')!.get()).values;
  return m.find((v) => v.labels.verdict === verdict && v.labels.outcome === outcome)?.value ?? 0;
}

t.test('no rule, no decision: decideTool is null (the relays take their path without tool calls)', async (t) => {
  const e = await env(t);
  for (const g of [null, { inspectors: [] }, { inspectors: [{ name: 'x', rules: [] }] }]) {
    const { ctx } = await e.call(g as LlmGovernance['inspection']);
    toolPolicy(ctx);
    t.equal(ctx.decideTool, null, JSON.stringify(g));
  }
  const { ctx } = await e.call();
  ctx.governance = null;
  t.equal(toolDecider(ctx), null, 'no governance');
  ctx.governance = { llm: { inspection: POLICY } } as unknown as EffectiveGovernance;
  ctx.inference = false;
  t.throws(
    () => toolPolicy(ctx),
    { name: 'Refusal' },
    'another route under a tool rule: refused (tool-policy-routes.test.ts)',
  );
  t.equal(ctx.decideTool, null, 'not an inference call: nothing decides');
});

t.test('allow and deny by the policy, recorded; detailed names the reason', async (t) => {
  const e = await env(t);
  const { decide, ctx } = await decider(e);
  t.same(await decide(tc('read_file', { path: '/etc/hosts' })), { allow: true, message: '' });
  t.same(await decide(tc('search', { q: 'x' })), { allow: true, message: '' }, 'no rule matched: allow');
  t.same(await decide(tc('transfer', { amount: 50 })), { allow: true, message: '' }, 'arg_gt not over the bound');
  const rm = await decide(tc('rm_rf', { path: '/' }, 'toolu_01'));
  t.equal(rm.allow, false);
  // The reason's wording is the evaluator's: the rule's summary is in it.
  t.match(
    rm.message,
    /^\[dvx\] The tool call rm_rf \(id toolu_01\) was not run: .*destructive tools are not allowed.*\.$/,
  );
  t.match(
    (await decide(tc('wire', { to: { limit: 11 } }, 'w1'))).message,
    /^\[dvx\] The tool call wire \(id w1\) was not run: .*inspectors\[1\]\.rules\[0\].*\.$/,
    'an unnamed inspector, a dotted arg_gt path',
  );
  t.equal((await decide(tc('wire', { to: { limit: 10 } }))).allow, true);
  t.equal(e.sink.rows.length, 6);
  const [read, search, , rmRow] = e.sink.rows;
  t.match(read, {
    call_id: ctx.id,
    org_id: 'org-1',
    agent_id: 'agent-1',
    agent_name: 'builder',
    enclave_id: 'enc-1',
    model: 'claude-sonnet-4',
    tool: 'read_file',
    tool_call_id: 'toolu_read_file',
    args_digest: /^[0-9a-f]{64}$/,
    arguments: '{"path":"/etc/hosts"}',
    args_parsed: true,
    rule: 'money.rules[2]',
    inspector: 'money',
    summary: 'reading is fine',
    verdict: 'allow',
    outcome: 'allow',
    decided_by: 'policy',
    policy_version: /^[0-9a-f]{16}$/,
    approval_id: null,
    held_ms: 0,
  });
  t.match(search, { rule: null, inspector: null, verdict: 'allow', outcome: 'allow', reason: /no rule/ });
  t.match(rmRow, {
    rule: 'money.rules[1]',
    verdict: 'deny',
    outcome: 'deny',
    reason: /destructive tools are not allowed/,
    decided_by: 'policy',
  });
  t.ok(
    e.sink.rows.every((r) => r.policy_version === read.policy_version),
    'one policy version',
  );
  t.equal(await counted(e, 'allow', 'allow'), 4);
  t.equal(await counted(e, 'deny', 'deny'), 2);
});

t.test('opaque: the agent reads "refused by policy"; the record keeps the detail', async (t) => {
  const e = await env(t, { options: { inspectionDisclosure: 'opaque' } });
  const { decide } = await decider(e);
  t.equal(
    (await decide(tc('rm_rf', {}, 'toolu_9'))).message,
    '[dvx] The tool call rm_rf (id toolu_9) was not run: refused by policy.',
  );
  t.equal(
    (await decide(tc('transfer', { amount: 1000 }, 'toolu_10'))).message,
    '[dvx] The tool call transfer (id toolu_10) was not run: refused by policy.',
  );
  t.match(e.sink.rows, [{ reason: /destructive tools are not allowed/ }, { reason: 'no approval service configured' }]);
});

t.test('require_approval without --approvals-url: denied, approvals-unavailable', async (t) => {
  const e = await env(t);
  const { decide } = await decider(e);
  const v = await decide(tc('transfer', { amount: 1000 }, 't1'));
  t.same(v, {
    allow: false,
    message: '[dvx] The tool call transfer (id t1) was not run: no approval service configured.',
  });
  t.match(e.sink.rows[0], {
    verdict: 'require_approval',
    outcome: 'deny',
    decided_by: 'approvals-unavailable',
    reason: 'no approval service configured',
    rule: 'money.rules[0]',
    summary: 'large transfers need a person',
  });
});

t.test('approved by a person: allowed, the approval carries the redacted arguments and the digest', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide, ctx } = await decider(e);
  peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'approved', 'alice@example.com'), 150);
  const args = { amount: 1000, note: `password ${SECRET}` };
  const v = await decide(tc('transfer', args, 'toolu_t'));
  t.same(v, { allow: true, message: '' });
  const [created] = peer.created;
  t.match(created, {
    call_id: ctx.id,
    org_id: 'org-1',
    agent_id: 'agent-1',
    agent_name: 'builder',
    model: 'claude-sonnet-4',
    tool: 'transfer',
    rule: 'money.rules[0]',
    summary: 'large transfers need a person',
  });
  t.match(created.arguments, /^\{"amount":1000,"note":"password [^"]+"\}$/);
  t.notMatch(JSON.stringify(created), SECRET, 'the secret never leaves for the broker');
  t.ok(
    Number(created.expires_in_ms) > 299_000 && Number(created.expires_in_ms) <= 300_000,
    'expires at the escalation deadline',
  );
  const row = e.sink.rows[0];
  t.match(row, {
    verdict: 'require_approval',
    outcome: 'allow',
    decided_by: 'alice@example.com',
    approval_id: peer.approvals.keys().next().value,
    args_digest: created.args_digest,
    policy_version: created.policy_version,
    arguments: created.arguments,
  });
  t.ok((row.held_ms as number) >= 100, `held ${row.held_ms} ms`);
  t.equal(row.decided_at, peer.approvals.values().next().value!.decided_at, "decided_at is the person's");
  const held = (await e.registry.getSingleMetric('dvx_llmproxy_tool_held_seconds')!.get()).values;
  t.ok(
    held.some(
      (x) =>
        x.labels.outcome === 'allow' && (x as { metricName?: string }).metricName?.endsWith('_count') && x.value === 1,
    ),
  );
});

t.test('denied by a person: the agent reads the reason, the record names who', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'denied', 'bob@example.com', 'not this month'), 50);
  const v = await decide(tc('transfer', { amount: 1000 }, 't2'));
  t.same(v, {
    allow: false,
    message: '[dvx] The tool call transfer (id t2) was not run: denied by an approver: not this month.',
  });
  t.match(e.sink.rows[0], {
    outcome: 'deny',
    decided_by: 'bob@example.com',
    reason: 'denied by bob@example.com: not this month',
  });
});

t.test('no decision before --escalation-timeout: denied (escalation timeout)', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer, options: { escalationTimeout: 1000 } });
  const { decide } = await decider(e);
  const started = Date.now();
  const v = await decide(tc('transfer', { amount: 1000 }, 't3'));
  t.ok(Date.now() - started >= 950 && Date.now() - started < 4000, `${Date.now() - started} ms`);
  t.equal(v.message, '[dvx] The tool call transfer (id t3) was not run: escalation timeout.');
  t.match(e.sink.rows[0], { outcome: 'deny', decided_by: 'escalation-timeout', reason: 'escalation timeout' });
  t.ok((e.sink.rows[0].held_ms as number) >= 950);
  t.ok(Number(peer.created[0].expires_in_ms) >= 1000 - 50 && Number(peer.created[0].expires_in_ms) <= 1000);
});

t.test('past the broker limits: denied, approval rate limit exceeded', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  peer.limit = 0;
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  const v = await decide(tc('transfer', { amount: 1000 }, 't4'));
  t.equal(v.message, '[dvx] The tool call transfer (id t4) was not run: approval rate limit exceeded.');
  t.match(e.sink.rows[0], {
    outcome: 'deny',
    decided_by: 'approval-limit',
    reason: 'approval rate limit exceeded',
    approval_id: null,
  });
});

t.test('the broker unreachable: denied, recorded; the agent never reads the internal error', async (t) => {
  const peer = await startApprovalsPeer();
  const url = peer.url;
  await peer.close();
  // the token and CA files are gone with the peer: keep copies
  const live = await startApprovalsPeer();
  t.teardown(() => live.close());
  const e = await env(t, { peer: live, approvalsUrl: url });
  const { decide } = await decider(e);
  const v = await decide(tc('transfer', { amount: 1000 }, 't5'));
  t.equal(v.message, '[dvx] The tool call transfer (id t5) was not run: the approval service is unavailable.');
  t.match(e.sink.rows[0], {
    outcome: 'deny',
    decided_by: 'approvals-unavailable',
    reason: /^approval service unavailable: approval service unreachable/,
  });
});

t.test('the agent leaves while held: the approval is cancelled, decided_by agent-gone', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide, leave } = await decider(e);
  const verdict = decide(tc('transfer', { amount: 1000 }, 't6'));
  const created = await peer.nextCreated();
  await new Promise((r) => setTimeout(r, 100));
  leave();
  const v = await verdict;
  t.equal(v.allow, false);
  t.same(peer.cancelled, [created.id], 'cancelled on the broker');
  t.equal(peer.approvals.get(created.id)!.status, 'cancelled');
  t.match(e.sink.rows[0], {
    outcome: 'deny',
    decided_by: 'agent-gone',
    approval_id: created.id,
    reason: 'the agent disconnected while the call was held (approval cancelled)',
  });
  // A call decided after the agent left creates no approval.
  const after = await decide(tc('transfer', { amount: 2000 }, 't7'));
  t.equal(after.allow, false);
  t.equal(peer.created.length, 1, 'no approval for an agent already gone');
  t.match(e.sink.rows[1], { decided_by: 'agent-gone' });
});

t.test('arguments that do not parse match every arg_gt (fail closed) and the record says so', async (t) => {
  const e = await env(t);
  const { decide } = await decider(e);
  const v = await decide(tc('transfer', '{"amount": 5', 't8'));
  t.equal(v.allow, false, 'held for approval, and no approval service: denied');
  t.match(e.sink.rows[0], {
    args_parsed: false,
    arguments: '{"amount": 5',
    verdict: 'require_approval',
    rule: 'money.rules[0]',
  });
  t.match(e.sink.rows[0].reason, /no approval service configured/);
  const w = await decide(tc('wire', '[1,2]', 't9'));
  t.equal(w.allow, false, 'an array is no arguments object');
  t.match(e.sink.rows[1], { args_parsed: false, verdict: 'deny', reason: /arg_gt/ }, 'the reason says why');
  t.match(w.message, /arg_gt/);
  // Prototype keys are data, never a path into the prototype.
  t.equal((await decide(tc('transfer', '{"__proto__":{"amount":1000}}'))).allow, true);
  t.equal((await decide(tc('wire', '{"to":{"__proto__":{"limit":99}}}'))).allow, true);
});

t.test('an approval for other arguments, another policy version, or decided after expiry does not apply', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ args_digest: 'f'.repeat(64) }, /other arguments/],
    [{ tool: 'transfer_all' }, /given for another tool/],
    [{ policy_version: 'ffffffffffffffff' }, /under policy version ffffffffffffffff/],
    [{ decided_at: new Date(Date.now() + 3_600_000).toISOString() }, /decided after it expired/],
  ];
  for (const [patch, reason] of cases) {
    peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'approved', 'carol', undefined, patch), 20);
    const v = await decide(tc('transfer', { amount: 1000 }, 'tx'));
    t.equal(v.message, '[dvx] The tool call transfer (id tx) was not run: the approval does not apply to this call.');
    t.match(e.sink.rows.at(-1), { outcome: 'deny', decided_by: 'carol', reason }, JSON.stringify(patch));
  }
});

t.test('an approval given while the policy changed (or went away) does not apply', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  const changed = { inspectors: [...POLICY!.inspectors, { rules: [{ tool: 'other', verdict: 'deny' as const }] }] };
  for (const [next, now] of [
    [snapshotOf(changed), /now [0-9a-f]{16}\)$/],
    [snapshotOf(null), /now none\)$/],
  ] as const) {
    peer.onCreate = (a) => {
      e.snapshot = next;
      setTimeout(() => peer.decide(a.id, 'approved', 'carol'), 20);
    };
    const v = await decide(tc('transfer', { amount: 1000 }, 'tp'));
    t.equal(v.message, '[dvx] The tool call transfer (id tp) was not run: the approval does not apply to this call.');
    t.match(e.sink.rows.at(-1), {
      outcome: 'deny',
      decided_by: 'carol',
      reason:
        /^approved by carol, but the approval does not apply: the policy changed while the call was held \(version [0-9a-f]{16}, /,
    });
    t.match(e.sink.rows.at(-1)!.reason, now);
    e.snapshot = snapshotOf(POLICY);
  }
  peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'approved', 'carol'), 20);
  t.equal((await decide(tc('transfer', { amount: 1000 }))).allow, true, 'the same policy again: it applies');
});

t.test('capture-or-deny: an allow whose record is not durable in time is a deny', async (t) => {
  const e = await env(t, { captureOrDeny: true });
  const { decide } = await decider(e);
  e.sink.hold = true;
  const v = await decide(tc('read_file', { path: 'a' }, 'r1'));
  t.same(v, {
    allow: false,
    message: '[dvx] The tool call read_file (id r1) was not run: the decision could not be recorded.',
  });
  t.equal(e.sink.rows.length, 2);
  t.match(e.sink.rows[0], { outcome: 'allow' });
  t.match(e.sink.rows[1], { id: `${e.sink.rows[0].id}.refused`, outcome: 'deny', reason: /not durable/ });
  t.equal(await counted(e, 'allow', 'deny'), 1);
  // A deny is never held back by the record.
  t.equal((await decide(tc('rm_rf', {}))).allow, false);
});

t.test('parallel calls with mixed verdicts are decided independently', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'approved', 'alice'), 100);
  const verdicts = await Promise.all([
    decide(tc('read_file', {}, 'a', 0)),
    decide(tc('transfer', { amount: 500 }, 'b', 1)),
    decide(tc('rm_rf', {}, 'c', 2)),
    decide(tc('transfer', { amount: 700 }, 'd', 3)),
  ]);
  t.same(
    verdicts.map((v) => v.allow),
    [true, true, false, true],
  );
  t.equal(peer.created.length, 2);
  t.same(e.sink.rows.map((r) => r.tool_call_id).sort(), ['a', 'b', 'c', 'd']);
});

t.test('a call the stream gate refuses itself is recorded: decided_by gate, outcome deny', async (t) => {
  const e = await env(t);
  const { decide, ctx } = await decider(e);
  // read_file is allowed by the policy, but the stream carries it inconsistently: in message_start's
  // content (never streamed as a block), and as a block whose index is not its position.
  const ev = (name: string, data: unknown) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
  const use = (id: string) => ({ type: 'tool_use', id, name: 'read_file', input: { path: '/etc/hosts' } });
  const stream =
    ev('message_start', {
      type: 'message_start',
      message: { id: 'm', type: 'message', role: 'assistant', content: [use('toolu_a')] },
    }) +
    ev('content_block_start', { type: 'content_block_start', index: 7, content_block: use('toolu_b') }) +
    ev('content_block_stop', { type: 'content_block_stop', index: 1 }) +
    ev('message_stop', { type: 'message_stop' });
  const gate = streamToolGate('anthropic-messages', decide);
  const out: Buffer[] = [];
  const reading = (async () => {
    for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
  })();
  gate.push(Buffer.from(stream));
  gate.end();
  await reading;
  t.notMatch(Buffer.concat(out).toString(), /"type":"tool_use"/, 'neither reaches the agent as a call');
  t.equal(e.sink.rows.length, 2, 'each refusal is a row');
  for (const [row, id, why] of [
    [e.sink.rows[0], 'toolu_a', /not streamed as a content block/],
    [e.sink.rows[1], 'toolu_b', /index was not its position/],
  ] as const) {
    t.match(row, {
      call_id: ctx.id,
      tool: 'read_file',
      tool_call_id: id,
      arguments: '{"path":"/etc/hosts"}',
      args_digest: /^[0-9a-f]{64}$/,
      verdict: 'allow',
      outcome: 'deny',
      decided_by: 'gate',
      reason: why,
      policy_version: /^[0-9a-f]{16}$/,
    });
  }
  t.equal(await counted(e, 'allow', 'deny'), 2);
});
t.test('an approval given while the agent was contained, suspended or moved does not release the call', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const e = await env(t, { peer });
  const { decide } = await decider(e);
  for (const [state, why] of [
    [{ contained: true }, /the agent is contained/],
    [{ status: 'suspended' }, /the agent is suspended/],
    [{ status: 'isolated' }, /the agent is isolated/],
    [{ org_id: 'org-2' }, /the agent is no longer in org org-1/],
  ] as const) {
    // Contained (or suspended) by the control plane while a person looks at the held call.
    peer.onCreate = (a) => {
      e.snapshot = snapshotOf(POLICY, state);
      setTimeout(() => peer.decide(a.id, 'approved', 'carol'), 20);
    };
    const v = await decide(tc('transfer', { amount: 1000 }, 'tc'));
    t.equal(v.allow, false, JSON.stringify(state));
    t.equal(v.message, '[dvx] The tool call transfer (id tc) was not run: the approval does not apply to this call.');
    t.match(e.sink.rows.at(-1), {
      outcome: 'deny',
      decided_by: 'carol',
      reason: why,
    });
    e.snapshot = snapshotOf(POLICY);
  }
  peer.onCreate = (a) => setTimeout(() => peer.decide(a.id, 'approved', 'carol'), 20);
  t.equal((await decide(tc('transfer', { amount: 1000 }))).allow, true, 'active again: it applies');
});

t.test(
  'a wait that fails (the broker answers nonsense): denied, and the approval is cancelled, not left for a yes',
  async (t) => {
    const peer = await startApprovalsPeer();
    t.teardown(() => peer.close());
    const e = await env(t, { peer });
    const { decide } = await decider(e);
    // The broker's long poll answers something that is no approvalView (a proxy in between, a bug).
    peer.fault = (req, res) => {
      if (req.method !== 'GET') return false;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"not":"an approval"}');
      return true;
    };
    const v = await decide(tc('transfer', { amount: 1000 }, 'tf'));
    t.equal(v.message, '[dvx] The tool call transfer (id tf) was not run: the approval service is unavailable.');
    const [created] = [...peer.approvals.values()];
    t.match(e.sink.rows.at(-1), { outcome: 'deny', decided_by: 'approvals-unavailable', approval_id: created!.id });
    // Left pending, a person could still approve a call that was already refused: the broker's audit would
    // say approved for a call that never ran.
    // (The cancel is not waited for: a broker that does not answer must not hold the denial up.)
    for (let i = 0; i < 100 && peer.cancelled.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    t.same(peer.cancelled, [created!.id], 'the approval is cancelled on the broker');
    t.equal(created!.status, 'cancelled');
  },
);
