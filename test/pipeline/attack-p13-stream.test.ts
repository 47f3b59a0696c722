import t from 'tap';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { findingKey, type ScanResult } from '../../pipeline/scan.ts';
import { SseJoiner } from '../../pipeline/sse-text.ts';
import { cannotMatchNewline, StreamInspection } from '../../pipeline/stream-inspection.ts';
import { scanStretch } from '../../pipeline/stream-scan.ts';
import { pooledPolicy } from '../../pipeline/pooled-policy.ts';

// An attacker's review of the streamed answer's inspection (P13): each case failed before its fix.
// 1. A custom pattern that can match the newline joining two blocks was called newline-free, so the
//    blocks were scanned one by one and a match spanning them was lost: a named class
//    (`[[:space:]]`, `[[:^alpha:]]`) and a range with an escaped bound (`[\t-~]`, TAB over U+000A).
// 2. A stop touched every block (a finish_reason walked them all; each push looked for stopped
//    blocks among all of them): a stream of many blocks cost its square. The joiner now hands each
//    stopped block over once, and a finish_reason stops only its own choice's open blocks.

const policyOf = (pattern: string) =>
  policyFromDocument(
    validatePolicyDocument({
      content_inspection: { patterns: [{ pattern, description: 'token', severity: 'block' }] },
    }),
  );
const ev = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
const delta = (index: number, text: string) =>
  ev({ type: 'content_block_delta', index, delta: { type: 'text_delta', text } });
const stop = (index: number) => ev({ type: 'content_block_stop', index });
const keys = (r: { findings: ScanResult['findings'] }) => r.findings.map(findingKey).sort();

for (const pattern of [
  'TOKEN[[:space:]]+[0-9a-f]{12}',
  'TOKEN[\\t-~]{1,3}[0-9a-f]{12}',
  'TOKEN[[:^alpha:]][0-9a-f]{12}',
]) {
  t.test(`a match across two blocks is found: ${pattern}`, async (t) => {
    t.equal(cannotMatchNewline(pattern), false, 'the pattern can match a newline');
    const policy = policyOf(pattern);
    const body = Buffer.from(
      `${delta(0, 'here is TOKEN')}${stop(0)}${delta(1, '0123456789ab rest')}${stop(1)}data: {"type":"message_stop"}\n\n`,
    );
    const engine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
    t.teardown(() => engine.close());
    const whole = await engine.inspect({ body, phase: 'response', policy, secrets: [] });
    t.ok(whole.findings.length > 0, 'the whole-body scan finds it');
    const plan = compilePlan(policy);
    const streamed = new StreamInspection(
      plan,
      policy,
      [],
      async (task) => scanStretch(plan, { ...task, policy: pooledPolicy(policy), secrets: [] }),
      () => undefined,
      64,
    );
    for (let at = 0; at < body.length; at += 16) {
      streamed.push(body.subarray(at, at + 16));
      await new Promise((resolve) => setImmediate(resolve));
    }
    t.strictSame(keys(await streamed.finish()), keys(whole), 'the streamed inspection finds the same');
  });
}

t.test('newline-free patterns are still read as such', async (t) => {
  for (const pattern of ['TOKEN-[0-9a-f]{12}', 'sk_[A-Za-z0-9]{20}', '[a-z]+@example\\.com', 'x[\\t ]y', 'a[!-~]b'])
    t.equal(cannotMatchNewline(pattern), true, pattern);
});

t.test('each stopped block is handed over once; a finish_reason stops only its own choice', async (t) => {
  const joiner = new SseJoiner();
  const chat = (index: unknown, d: Record<string, unknown>, finish?: string) =>
    ev({ choices: [{ index, delta: d, ...(finish ? { finish_reason: finish } : {}) }] });
  joiner.push(
    Buffer.from(
      chat(0, { content: 'a' }) +
        chat(0, { tool_calls: [{ index: 0, function: { arguments: '{}' } }] }) +
        // A choice index that reads like another choice's tool-call block (`c0t1…`).
        chat('0t1', { content: 'b' }) +
        chat(1, { content: 'c' }) +
        chat(0, {}, 'tool_calls') +
        chat(0, {}, 'tool_calls'),
    ),
  );
  const first = joiner.takeStopped().map((b) => b.key);
  t.same(first, ['c0', 'c0t0'], "choice 0's blocks, once, though its finish_reason came twice");
  t.same(joiner.takeStopped(), [], 'nothing more until another stop');
  const byKey = new Map([...joiner.blocks()].map((b) => [b.key, b.stopped]));
  t.same(Object.fromEntries(byKey), { c0: true, c0t0: true, c0t1: false, c1: false });
  joiner.push(Buffer.from(delta(0, 'x') + stop(0) + stop(0)));
  t.same(
    joiner.takeStopped().map((b) => b.key),
    ['a0'],
    'a content block once, however often its stop comes',
  );
});
