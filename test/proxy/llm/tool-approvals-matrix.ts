import type { Test } from 'tap';
import type { Harness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';
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
  raw,
  sha256,
  upstreamBytes,
  viaSdk,
  WIRE,
  type Broker,
  type Format,
  type Seen,
} from './tool-approvals-fixture.ts';

// The cases every format goes through, plain or streamed (tool-approvals-e2e-plain.test.ts and
// -stream.test.ts run them): allow, deny by policy, approved by a person (the original bytes), denied
// by a person, parallel calls with mixed verdicts, unparseable arguments, the agent leaving while held.
// Each case checks what the agent's official SDK (or its raw bytes) got, the proxy's
// tool_call_decisions rows and the broker's approvalView.

const calls = (seen: Seen[]) => seen.filter((s): s is Extract<Seen, { call: string }> => 'call' in s);
const texts = (seen: Seen[]) => seen.filter((s): s is { text: string } => 'text' in s).map((s) => s.text);
const HOLD_RULE = { rule: 'e2e.rules[2]', inspector: 'e2e', summary: 'A person decides', verdict: 'require_approval' };
const STOP_TOOL: Record<Format, string | null> = {
  'anthropic-messages': 'tool_use',
  'openai-chat': 'tool_calls',
  'openai-responses': null,
};
const STOP_TEXT: Record<Format, string | null> = {
  'anthropic-messages': 'end_turn',
  'openai-chat': 'stop',
  'openai-responses': null,
};

/** The approval's binding, as the proxy's row and the broker's view both hold it. */
function sameApproval(t: Test, row: Record<string, unknown>, view: Record<string, any>, tool: string, agent: string) {
  t.match(view, {
    id: row.approval_id,
    org_id: 'org-1',
    agent_id: agent,
    agent_name: `name-${agent}`,
    tool,
    args_digest: row.args_digest,
    policy_version: row.policy_version,
    rule: 'e2e.rules[2]',
    summary: 'A person decides',
  });
}

export function matrix(t: Test, h: Harness, b: Broker, stream: boolean, agent: string) {
  const mode = stream ? 'streamed' : 'plain';
  for (const format of FORMATS) {
    const tag = `${format.replace('-', '_')}_${stream ? 's' : 'p'}`;
    t.test(`${format} ${mode}: allow by policy: the call as the upstream sent it, recorded`, async (t) => {
      const tool = `allow_${tag}`;
      const { res, headers, body } = await raw(h, format, stream, agent, [{ name: tool, input: { path: '/tmp' } }]);
      t.equal(res.statusCode, 200);
      t.equal(await res.body.text(), await upstreamBytes(h, WIRE[format].path, body, headers), 'byte for byte');
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        agent_id: agent,
        org_id: 'org-1',
        tool,
        tool_call_id: idOf(format, 1),
        verdict: 'allow',
        outcome: 'allow',
        decided_by: 'policy',
        rule: 'e2e.rules[0]',
        approval_id: null,
        args_digest: sha256('{"path":"/tmp"}'),
        args_parsed: true,
        policy_version: /^[0-9a-f]{16}$/,
      });
      t.same(await approvalsOf(b, tool), [], 'no approval asked');
      const sdk = await viaSdk(h, format, stream, agent, [{ name: tool, input: { path: '/tmp' } }]);
      t.same(calls(sdk.seen), [{ call: tool, id: idOf(format, 1), args: '{"path":"/tmp"}' }]);
      t.equal(sdk.stop, STOP_TOOL[format]);
    });

    t.test(`${format} ${mode}: deny by policy: the agent reads the denial, recorded`, async (t) => {
      const tool = `deny_${tag}`;
      const sdk = await viaSdk(h, format, stream, agent, [{ name: tool, input: { path: '/' } }], 'Cleaning up.');
      t.same(calls(sdk.seen), [], 'no executable call');
      const reason = 'denied by rule e2e.rules[1] (Never in tests)';
      t.match(texts(sdk.seen).join('\n\n'), `${denial(tool, idOf(format, 1), reason)}`);
      t.match(texts(sdk.seen).join(''), /^Cleaning up\./, 'the text before it intact');
      t.equal(sdk.stop, STOP_TEXT[format]);
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        verdict: 'deny',
        outcome: 'deny',
        decided_by: 'policy',
        rule: 'e2e.rules[1]',
        reason,
        approval_id: null,
        args_digest: sha256('{"path":"/"}'),
      });
      t.same(await approvalsOf(b, tool), [], 'no approval asked');
    });

    t.test(`${format} ${mode}: require_approval, approved by a person: the original bytes`, async (t) => {
      const tool = `hold_${tag}_ok`;
      const args = { to: 'acct-9', amount: 1e3, memo: 'caf\u00e9' };
      const answer = raw(h, format, stream, agent, [{ name: tool, input: args }], 'Paying.');
      const pending = await pendingOf(b, tool);
      t.match(pending, { status: 'pending', arguments: args, decided_by: null });
      const approved = await decide(b, pending.id, 'approve', 'checked');
      t.match(approved, { status: 'approved', decided_by: 'admin-1', reason: 'checked' });
      const { res, headers, body } = await answer;
      t.equal(res.statusCode, 200);
      const text = await res.body.text();
      t.equal(text, await upstreamBytes(h, WIRE[format].path, body, headers), 'byte for byte');
      if (!stream) t.equal(res.headers['content-length'], String(Buffer.byteLength(text)));
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        ...HOLD_RULE,
        outcome: 'allow',
        decided_by: 'admin-1',
        decided_at: approved.decided_at,
        approval_id: pending.id,
        reason: 'approved by admin-1',
        args_digest: sha256(JSON.stringify({ amount: 1e3, memo: 'caf\u00e9', to: 'acct-9' })),
      });
      t.ok((row.held_ms as number) > 0, 'held');
      sameApproval(t, row, await approvalView(b, pending.id), tool, agent);
    });

    t.test(`${format} ${mode}: require_approval, denied by a person: the agent reads it`, async (t) => {
      const tool = `hold_${tag}_no`;
      const answer = viaSdk(h, format, stream, agent, [{ name: tool, input: { x: 1 } }]);
      const pending = await pendingOf(b, tool);
      await decide(b, pending.id, 'deny', 'not today');
      const sdk = await answer;
      t.same(calls(sdk.seen), []);
      t.same(texts(sdk.seen), [denial(tool, idOf(format, 1), 'denied by an approver: not today')]);
      t.equal(sdk.stop, STOP_TEXT[format]);
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        ...HOLD_RULE,
        outcome: 'deny',
        decided_by: 'admin-1',
        reason: 'denied by admin-1: not today',
        approval_id: pending.id,
      });
      const view = await approvalView(b, pending.id);
      t.match(view, { status: 'denied', reason: 'not today', decided_by: 'admin-1' });
      sameApproval(t, row, view, tool, agent);
    });

    t.test(`${format} ${mode}: parallel calls, mixed verdicts: allowed, denied, held then approved`, async (t) => {
      const [ok, no, held] = [`allow_${tag}_par`, `deny_${tag}_par`, `hold_${tag}_par`];
      const list = [
        { name: ok, input: { a: 1 } },
        { name: no, input: { b: 2 } },
        { name: held, input: { c: 3 } },
      ];
      const answer = viaSdk(h, format, stream, agent, list, 'Three things.');
      const pending = await pendingOf(b, held);
      // The other two were decided on their own, while the third waits.
      t.ok(
        await until(() =>
          decisionsOf(h, ok)
            .then(() => decisionsOf(h, no))
            .then(() => true),
        ),
      );
      await decide(b, pending.id, 'approve');
      const sdk = await answer;
      t.same(calls(sdk.seen), [
        { call: ok, id: idOf(format, 1), args: '{"a":1}' },
        { call: held, id: idOf(format, 3), args: '{"c":3}' },
      ]);
      t.match(
        texts(sdk.seen).join('\n\n'),
        denial(no, idOf(format, 2), 'denied by rule e2e.rules[1] (Never in tests)'),
      );
      t.equal(sdk.stop, STOP_TOOL[format], 'allowed calls remain');
      const rows = [...(await decisionsOf(h, ok)), ...(await decisionsOf(h, no)), ...(await decisionsOf(h, held))];
      t.same(
        rows.map((r) => [r.tool_call_id, r.verdict, r.outcome, r.decided_by, r.approval_id]),
        [
          [idOf(format, 1), 'allow', 'allow', 'policy', null],
          [idOf(format, 2), 'deny', 'deny', 'policy', null],
          [idOf(format, 3), 'require_approval', 'allow', 'admin-1', pending.id],
        ],
      );
      t.equal(new Set(rows.map((r) => r.call_id)).size, 1, 'one call, its three decisions');
      t.equal((await approvalsOf(b, held)).length, 1, 'one approval, for the held call only');
    });

    t.test(`${format} ${mode}: arguments that do not parse meet every arg_gt (fail closed)`, async (t) => {
      const tool = `pay_${tag}`;
      const text = '{"amount": 9';
      const answer = viaSdk(h, format, stream, agent, [{ name: tool, arguments: text }]);
      const pending = await pendingOf(b, tool);
      t.match(pending, { rule: 'e2e.rules[3]', summary: 'Large payments' });
      await decide(b, pending.id, 'deny');
      const sdk = await answer;
      t.same(calls(sdk.seen), [], 'never an executable call');
      t.same(texts(sdk.seen), [denial(tool, idOf(format, 1), 'denied by an approver')]);
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        verdict: 'require_approval',
        rule: 'e2e.rules[3]',
        args_parsed: false,
        outcome: 'deny',
        approval_id: pending.id,
      });
      if (format !== 'anthropic-messages' || stream) {
        // As the agent's SDK would assemble them: the raw text, digested and shown as it is.
        t.equal(row.arguments, text);
        t.equal(row.args_digest, sha256(text));
        t.equal(pending.arguments, text, 'the broker shows the text');
      }
      t.equal(pending.args_digest, row.args_digest);
    });

    t.test(`${format} ${mode}: the agent leaves while held: the approval is cancelled on the broker`, async (t) => {
      const tool = `hold_${tag}_gone`;
      const abort = new AbortController();
      const answer = raw(h, format, stream, agent, [{ name: tool, input: {} }], undefined, abort.signal);
      if (stream) {
        const { res } = await answer;
        t.equal(res.statusCode, 200, 'the stream began');
        res.body.on('error', () => {});
      }
      const pending = await pendingOf(b, tool);
      const records = h.audit.length;
      abort.abort();
      if (!stream) await t.rejects(answer);
      const view = await becomes(b, pending.id, 'cancelled');
      t.match(view, { status: 'cancelled', decided_by: 'satellite' });
      const [row] = await decisionsOf(h, tool);
      t.match(row, {
        ...HOLD_RULE,
        outcome: 'deny',
        decided_by: 'agent-gone',
        approval_id: pending.id,
        reason: 'the agent disconnected while the call was held (approval cancelled)',
      });
      t.ok(
        await until(() =>
          h.audit
            .slice(records)
            .some(
              (r) =>
                r.table === 'llm_audit_log' &&
                r.id === row.call_id &&
                r.error === 'the agent closed the connection before the answer was delivered',
            ),
        ),
        "the call's own record says the agent left",
      );
      t.equal(
        (await b.operator('admin-1', 'POST', `/api/v1/approvals/${pending.id}/approve`, {})).status,
        409,
        'too late to approve',
      );
    });
  }
}
