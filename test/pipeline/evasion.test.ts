import t from 'tap';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// Evasion through the engine: the normalized view is read inline, on a pool worker, and when a
// large body is split across two workers (each half builds the view it needs), with the same findings.
const policy = policyFromDocument(
  validatePolicyDocument({
    content_inspection: {
      secrets_filter: { enabled: true },
      pii_detection: { enabled: true },
      api_key_detection: { enabled: true, severity: 'block' },
      patterns: [{ pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' }],
    },
  }),
);
const SECRETS = ['hunter2hunter2'];
const EVASIVE =
  'mail a＠example&period;com key AKIA&#x200b;IOSFODNN7EXAMPLE secret HUNTER2\u200bhunter2 ｐｒｏｊｅｃｔ－７';
const body = (pad: number) =>
  Buffer.from(
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      messages: [{ role: 'user', content: EVASIVE + ' lorem ipsum'.repeat(pad) }],
    }),
  );
const summary = (findings: { inspector_type: string; match: string }[]) =>
  findings.map((f) => `${f.inspector_type}:${f.match}`).sort();
const EXPECTED = ['api_key:AKIA****', 'patterns:proj****', 'pii:a@ex****', 'secrets:hunt****'];

t.test('inline, pool and split runs find what the evasions hid', async (t) => {
  const inline = new InspectionEngine({ threads: 0 });
  const pool = new InspectionEngine({ threads: 2, inlineThresholdBytes: 4096, timeoutMs: 60_000 });
  t.teardown(async () => {
    await inline.close();
    await pool.close();
  });
  const small = await inline.inspect({ body: body(0), phase: 'request', policy, secrets: SECRETS });
  t.same(summary(small.findings), EXPECTED, 'inline');
  t.equal(small.decision, 'block');
  const pooled = await pool.inspect({ body: body(1000), phase: 'request', policy, secrets: SECRETS });
  t.equal(pooled.mode, 'pool');
  t.same(summary(pooled.findings), EXPECTED, 'on a pool worker');
  const big = body(400_000);
  t.ok(big.length >= 4 * 1024 * 1024, 'large enough to be split');
  const split = await pool.inspect({ body: big, phase: 'request', policy, secrets: SECRETS });
  t.same(split.failures, []);
  t.same(summary(split.findings), EXPECTED, 'split across two workers');
});

t.test('a pad of invisibles and & the view once choked on does not time the inspection out', async (t) => {
  // 12 MB of `\u200b&` took the old view 3.5 s, past the default 2 s deadline: the body passed fail-open
  // with no finding. Default deadline, pooled as a proxy runs it.
  const engine = new InspectionEngine({ threads: 2 });
  t.teardown(() => engine.close());
  const blocking = policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true, severity: 'block' },
        api_key_detection: { enabled: true, severity: 'block' },
      },
    }),
  );
  const pad = '\u200b&'.repeat(3 * 1024 * 1024);
  const padded = Buffer.from(
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      messages: [{ role: 'user', content: `${pad} password s3cr3t-db-password-2026 key AKIAIOSFODNN7EXAMPLE` }],
    }),
  );
  t.ok(padded.length >= 12 * 1024 * 1024);
  const result = await engine.inspect({
    body: padded,
    phase: 'request',
    policy: blocking,
    secrets: ['s3cr3t-db-password-2026'],
  });
  t.same(result.failures, [], 'nothing timed out');
  t.equal(result.failOpen, false);
  t.equal(result.decision, 'block');
  t.same([...new Set(result.findings.map((f) => f.inspector_type))].sort(), ['api_key', 'secrets']);
});

t.test('a pad the view once took 2 s over does not time the inspection out (marks and invalid bytes)', async (t) => {
  // 32 MB of `α` with a mark, then `և` ×7 (its view is twice its size), and a nested `&amp;` at the
  // end: the old view made an NFC call every 16 bytes and walked the doubled view twice more, past the
  // default 2 s deadline (`normalized_view: timeout`, fail-open) two runs in three. Default deadline,
  // pooled as a proxy runs it, the pool warmed first.
  const engine = new InspectionEngine({ threads: 2 });
  t.teardown(() => engine.close());
  const blocking = policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true, severity: 'block' },
        api_key_detection: { enabled: true, severity: 'block' },
      },
    }),
  );
  const SECRET = 's3cr3t-db-password-2026';
  const tail = ' AKIA\u200bIOSFODNN7EXAMPLE s3cr3t-db-pass\u200bword-2026 &amp;amp;amp;';
  const request = (content: string) =>
    Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content }] }));
  const warm = await engine.inspect({
    body: request('x'.repeat(200_000) + tail),
    phase: 'request',
    policy: blocking,
    secrets: [SECRET],
  });
  t.equal(warm.decision, 'block', 'warm-up');
  const unit = 'α\u0316' + '\u0587'.repeat(7);
  const padded = request(unit.repeat(Math.floor((32 * 1024 * 1024) / Buffer.byteLength(unit))) + tail);
  t.ok(padded.length >= 32 * 1024 * 1024 - 64);
  const result = await engine.inspect({ body: padded, phase: 'request', policy: blocking, secrets: [SECRET] });
  t.same(result.failures, [], 'nothing timed out');
  t.equal(result.failOpen, false);
  t.equal(result.decision, 'block');
  t.same([...new Set(result.findings.map((f) => f.inspector_type))].sort(), ['api_key', 'secrets']);
});
