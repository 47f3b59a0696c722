import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { freePort } from './secret-broker-fixture.ts';
import {
  approvalsOf,
  approvalView,
  becomes,
  decide,
  decisionsOf,
  denial,
  FORMATS,
  idOf,
  pendingOf,
  POLICY,
  raw,
  sha256,
  snapshotWith,
  startE2eBroker,
  startE2eProxy,
  viaSdk,
  upstreamBytes,
  type Format,
} from './tool-approvals-fixture.ts';
import { PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';

// The tool-call approval loop end to end when it does not end in a person's yes or no: the escalation
// timeout, the broker's rate limit, opaque disclosure, no broker configured, the broker unreachable,
// a policy that changes while a call is held, arguments with secrets in them, a tool name no person
// should be shown. Every format, plain and streamed, through the
// official SDKs; each case checks what the agent read, the proxy's tool_call_decisions rows and the
// broker's approvals.

const b = await startE2eBroker();
t.teardown(() => b.close());

/** Every format, plain and streamed: [format, stream, a tag for tool names]. */
const EVERY: [Format, boolean, string][] = FORMATS.flatMap((f) =>
  [false, true].map((s): [Format, boolean, string] => [f, s, `${f.replace('-', '_')}_${s ? 's' : 'p'}`]),
);
const only = (seen: { text?: string; call?: string }[]) => seen.map((s) => s.text ?? `call ${s.call}`);

t.test('escalation timeout: no decision in time, the broker shows it expired, the agent is denied', async (t) => {
  const h = await startE2eProxy(b, { escalationTimeout: 2000 });
  t.teardown(() => h.close());
  await Promise.all(
    EVERY.map(async ([format, stream, tag]) => {
      const tool = `hold_${tag}_late`;
      const sdk = await viaSdk(h, format, stream, 'agent-1', [{ name: tool, input: {} }]);
      t.same(only(sdk.seen), [denial(tool, idOf(format, 1), 'escalation timeout')], `${format} ${stream}`);
      const [row] = await decisionsOf(h, tool);
      t.match(row, { verdict: 'require_approval', outcome: 'deny', decided_by: 'escalation-timeout' });
      t.ok((row.held_ms as number) >= 1900, `held ${row.held_ms} ms`);
      const view = await becomes(b, row.approval_id as string, 'expired');
      t.match(view, {
        status: 'expired',
        decided_by: 'escalation-timeout',
        reason: 'no decision before expires_at',
        args_digest: row.args_digest,
      });
      t.ok(Date.parse(view.expires_at) - Date.parse(view.created_at) <= 2000, 'expires at the escalation deadline');
      t.equal((await b.operator('admin-1', 'POST', `/api/v1/approvals/${view.id}/approve`, {})).status, 409);
    }),
  );
});

t.test('rate limit: past 10 pending approvals of an agent, approval rate limit exceeded', async (t) => {
  const h = await startE2eProxy(b);
  t.teardown(() => h.close());
  const abort = new AbortController();
  const held = Array.from({ length: 10 }, (_, i) =>
    raw(h, FORMATS[i % 3], false, 'agent-4', [{ name: `hold_limit_${i}`, input: { i } }], undefined, abort.signal),
  );
  for (const p of held) p.catch(() => {});
  t.ok(
    await until(
      async () =>
        (await b.operator('admin-1', 'GET', '/api/v1/approvals?status=pending&agent=agent-4')).body.approvals.length ===
        10,
    ),
    '10 pending on the broker',
  );
  for (const [format, stream, tag] of EVERY) {
    const tool = `hold_${tag}_over`;
    const sdk = await viaSdk(h, format, stream, 'agent-4', [{ name: tool, input: {} }]);
    t.same(only(sdk.seen), [denial(tool, idOf(format, 1), 'approval rate limit exceeded')], `${format} ${stream}`);
    const [row] = await decisionsOf(h, tool);
    t.match(row, {
      verdict: 'require_approval',
      outcome: 'deny',
      decided_by: 'approval-limit',
      reason: 'approval rate limit exceeded',
      approval_id: null,
    });
    t.same(await approvalsOf(b, tool), [], 'no approval made');
  }
  t.ok(
    b.audit.some((r) => r.action === 'approval.create' && r.outcome === 'deny'),
    'the broker audited the refused create',
  );
  // Another agent of the org is not limited by this one's approvals.
  const other = viaSdk(h, 'openai-chat', false, 'agent-5', [{ name: 'hold_limit_other', input: {} }]);
  await decide(b, (await pendingOf(b, 'hold_limit_other')).id, 'approve');
  t.match((await other).seen, [{ call: 'hold_limit_other' }]);
  abort.abort();
  t.ok(
    await until(
      async () =>
        (await b.operator('admin-1', 'GET', '/api/v1/approvals?status=cancelled&agent=agent-4')).body.approvals
          .length === 10,
    ),
    'the agent gone: its ten approvals cancelled',
  );
});

t.test(
  'opaque disclosure: the agent reads "refused by policy"; the record and the broker keep the detail',
  async (t) => {
    const h = await startE2eProxy(b, { inspectionDisclosure: 'opaque' });
    t.teardown(() => h.close());
    await Promise.all(
      EVERY.map(async ([format, stream, tag]) => {
        const [held, denied] = [`hold_${tag}_opaque`, `deny_${tag}_opaque`];
        const answer = viaSdk(h, format, stream, 'agent-3', [
          { name: held, input: {} },
          { name: denied, input: {} },
        ]);
        const pending = await pendingOf(b, held);
        await decide(b, pending.id, 'deny', 'internal ticket 4711');
        const sdk = await answer;
        const opaque = (tool: string, n: number) => denial(tool, idOf(format, n), 'refused by policy');
        t.same(
          only(sdk.seen),
          format === 'openai-chat'
            ? [`${opaque(held, 1)}\n\n${opaque(denied, 2)}`]
            : [opaque(held, 1), opaque(denied, 2)],
          `${format} ${stream}`,
        );
        t.notMatch(JSON.stringify(sdk.seen), /4711|admin-1|Never in tests/, 'no detail');
        t.match((await decisionsOf(h, held))[0], {
          decided_by: 'admin-1',
          reason: 'denied by admin-1: internal ticket 4711',
        });
        t.match((await decisionsOf(h, denied))[0], { reason: 'denied by rule e2e.rules[1] (Never in tests)' });
        t.match(await approvalView(b, pending.id), { status: 'denied', reason: 'internal ticket 4711' });
      }),
    );
  },
);

t.test('no --approvals-url: a call needing approval is denied, recorded', async (t) => {
  const h = await startE2eProxy(null);
  t.teardown(() => h.close());
  for (const [format, stream, tag] of EVERY) {
    const tool = `hold_${tag}_nobroker`;
    const sdk = await viaSdk(h, format, stream, 'agent-1', [{ name: tool, input: {} }]);
    t.same(only(sdk.seen), [denial(tool, idOf(format, 1), 'no approval service configured')], `${format} ${stream}`);
    t.match((await decisionsOf(h, tool))[0], {
      verdict: 'require_approval',
      outcome: 'deny',
      decided_by: 'approvals-unavailable',
      reason: 'no approval service configured',
      approval_id: null,
    });
  }
});

t.test('the broker unreachable: denied, recorded; the agent never reads the internal error', async (t) => {
  const h = await startE2eProxy(b, { approvalsUrl: `https://127.0.0.1:${await freePort()}` });
  t.teardown(() => h.close());
  for (const [format, stream, tag] of EVERY) {
    const tool = `hold_${tag}_down`;
    const sdk = await viaSdk(h, format, stream, 'agent-1', [{ name: tool, input: {} }]);
    t.same(
      only(sdk.seen),
      [denial(tool, idOf(format, 1), 'the approval service is unavailable')],
      `${format} ${stream}`,
    );
    t.match((await decisionsOf(h, tool))[0], {
      outcome: 'deny',
      decided_by: 'approvals-unavailable',
      reason: /^approval service unavailable: /,
      approval_id: null,
    });
    t.same(await approvalsOf(b, tool), []);
  }
});

t.test('the policy changes while a call is held: the approval given under the old one does not apply', async (t) => {
  const h = await startE2eProxy(b);
  t.teardown(() => h.close());
  const changed = {
    inspection: {
      inspectors: [...POLICY.inspection.inspectors, { name: 'later', rules: [{ tool: 'rm_*', verdict: 'deny' }] }],
    },
  };
  for (const [format, stream] of [
    ['anthropic-messages', false],
    ['openai-chat', true],
  ] as const) {
    const tool = `hold_${format.replace('-', '_')}_${stream}_stale`;
    const answer = viaSdk(h, format, stream, 'agent-5', [{ name: tool, input: { amount: 5 } }]);
    const pending = await pendingOf(b, tool);
    await h.writeSnapshot(snapshotWith(changed)(h.upstream.url));
    await decide(b, pending.id, 'approve');
    const sdk = await answer;
    t.same(only(sdk.seen), [denial(tool, idOf(format, 1), 'the approval does not apply to this call')]);
    const [row] = await decisionsOf(h, tool);
    t.match(row, {
      outcome: 'deny',
      decided_by: 'admin-1',
      approval_id: pending.id,
      policy_version: pending.policy_version,
      reason: /^approved by admin-1, but the approval does not apply: the policy changed while the call was held/,
    });
    t.equal((await approvalView(b, pending.id)).status, 'approved', 'the broker keeps what the person said');
    // Under the new policy a new approval applies again.
    const again = viaSdk(h, format, stream, 'agent-5', [{ name: tool, input: { amount: 5 } }]);
    const next = await pendingOf(b, tool);
    t.not(next.policy_version, pending.policy_version, 'asked under the new version');
    await decide(b, next.id, 'approve');
    t.match((await again).seen, [{ call: tool }]);
    await h.writeSnapshot(snapshotWith()(h.upstream.url));
  }
});

t.test('what a person sees is redacted; what the agent runs is what the model sent', async (t) => {
  const h = await startE2eProxy(b);
  t.teardown(() => h.close());
  const args = { to: 'ops@example.com', note: `key ${PLATFORM_KEY}`, amount: 900 };
  const answer = raw(h, 'openai-responses', false, 'agent-6', [{ name: 'pay_redacted', input: args }]);
  const pending = await pendingOf(b, 'pay_redacted');
  const shown = JSON.stringify(pending.arguments);
  t.notMatch(shown, PLATFORM_KEY, 'no key on the broker');
  t.notMatch(shown, 'ops@example.com', 'no e-mail address on the broker');
  t.match(pending.arguments, { amount: 900 }, 'the rest as it was');
  t.equal(
    pending.args_digest,
    sha256(JSON.stringify({ amount: 900, note: args.note, to: args.to })),
    'the digest of the real arguments',
  );
  await decide(b, pending.id, 'approve');
  const { res, headers, body } = await answer;
  t.equal(await res.body.text(), await upstreamBytes(h, '/v1/responses', body, headers), 'delivered byte for byte');
  const [row] = await decisionsOf(h, 'pay_redacted');
  t.notMatch(String(row.arguments), PLATFORM_KEY, 'nor in the record');
  t.equal(row.arguments, JSON.stringify(pending.arguments), 'the record holds what the person saw');
});

t.test('a tool name the broker will not show a person (a bidi override) is denied, never waved through', async (t) => {
  const h = await startE2eProxy(b);
  t.teardown(() => h.close());
  const tool = 'hold_\u202etxt.exe';
  const sdk = await viaSdk(h, 'anthropic-messages', true, 'agent-6', [{ name: tool, input: {} }]);
  t.same(only(sdk.seen), [denial(tool, 'toolu_1', 'the approval service is unavailable')]);
  t.match((await decisionsOf(h, tool))[0], {
    verdict: 'require_approval',
    outcome: 'deny',
    decided_by: 'approvals-unavailable',
    reason: /^approval service unavailable: .*400/,
  });
  t.same(await approvalsOf(b, tool), [], 'nothing pending for a person to misread');
});

t.test('the agent is contained while a call is held: the call ends at once, its approval cancelled', async (t) => {
  const h = await startE2eProxy(b);
  t.teardown(() => h.close());
  for (const [format, stream] of [
    ['anthropic-messages', false],
    ['openai-chat', true],
  ] as const) {
    const tool = `hold_${format.replace('-', '_')}_${stream}_contained`;
    const started = Date.now();
    const answer = viaSdk(h, format, stream, 'agent-2', [{ name: tool, input: { amount: 5 } }]).then(
      (sdk) => ({ sdk, err: null }),
      (err: Error) => ({ sdk: null, err }),
    );
    const pending = await pendingOf(b, tool);
    const contained = snapshotWith()(h.upstream.url);
    (contained.agents['agent-2'] as { contained: boolean }).contained = true;
    await h.writeSnapshot(contained);
    const { sdk, err } = await answer;
    t.ok(Date.now() - started < 30_000, 'ended well before the escalation timeout');
    t.equal(sdk, null, `${format} ${stream}: the agent gets no answer to run`);
    if (!stream) t.match(err, { status: 403 }, 'not answered yet: the spec 403');
    const [row] = await decisionsOf(h, tool);
    t.match(row, {
      outcome: 'deny',
      decided_by: 'agent-refused',
      approval_id: pending.id,
      reason: /^policy changed: agent is contained while the call was held \(approval cancelled\)/,
    });
    t.equal((await becomes(b, pending.id, 'cancelled')).status, 'cancelled', 'nothing is left for a person to approve');
    await h.writeSnapshot(snapshotWith()(h.upstream.url));
  }
});
