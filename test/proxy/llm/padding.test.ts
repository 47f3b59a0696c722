import t from 'tap';
import { AGENT_SECRET, baseSnapshot, startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';

// Padding must not turn fail-open into a bypass. Megabytes of card-like digit groups (a near miss
// of a card, re-scanned from every group) ahead of a secret and a key used to run the built-in group
// past --inspect-timeout, and the secret and key went upstream with `findings: []`. Now every
// inspector is linear on it (default deadline, real proxy), and an inspector that does miss the
// deadline is named in the record while what finished still counts.

const CONTENT = {
  secrets_filter: { enabled: true, severity: 'block' },
  pii_detection: { enabled: true, severity: 'warn' },
  api_key_detection: { enabled: true, severity: 'block' },
  patterns: [
    { pattern: '\\bINC-[0-9]{6}\\b', description: 'incident id', severity: 'log' },
    { pattern: '(?i)project[- ]nightingale', description: 'codename', severity: 'block' },
    { pattern: '\\bacct_[0-9]{8,12}\\b', description: 'account id', severity: 'warn' },
  ],
};
const snapshot = (url: string) => {
  const s = baseSnapshot(url) as { orgs: Record<string, { config: Record<string, unknown> }> };
  s.orgs['org-1'].config.content_inspection = { value: CONTENT };
  return s;
};
const TAIL = ` password ${AGENT_SECRET} key AKIAIOSFODNN7EXAMPLE`;
const padded = (marker = '', mb = 12) =>
  JSON.stringify({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [
      { role: 'user', content: marker + '4111 1111 1111 111 '.repeat(Math.ceil((mb * 1024 * 1024) / 19)) + TAIL },
    ],
  });
const post = async (h: Harness, body: string) =>
  h.call('/v1/messages', { headers: { 'content-type': 'application/json', 'x-api-key': await h.token() }, body });

/** A first pooled call, so the pool's thread has started (slow on a loaded machine) before the one measured. */
async function warm(h: Harness) {
  for (let i = 0; i < 5; i++) {
    if (
      (
        await post(
          h,
          JSON.stringify({
            model: 'claude-sonnet-4-5',
            max_tokens: 8,
            messages: [{ role: 'user', content: 'warm '.repeat(40_000) }],
          }),
        )
      ).status === 200 &&
      h.audit.at(-1)?.inspection_failopen === false
    )
      return;
  }
}

// The body was ~12 MB; the old scan took ~2 s on it here, at the edge of the deadline, so the
// test pads twice that (the old code fails open on it every time; the new one takes a fraction).
t.test('24 MB of card near misses ahead of a secret and a key: 403, both found, nothing failed', async (t) => {
  const h = await startHarness({ snapshot });
  t.teardown(() => h.close());
  await warm(h);
  const before = h.upstream.received.length;
  const r = await post(h, padded('', 24));
  t.equal(r.status, 403);
  t.equal(h.upstream.received.length, before, 'nothing went upstream');
  const record = h.audit.at(-1)!;
  t.match(
    record,
    { status: 403, decision: 'block', inspection_failopen: false, inspection_failures: [] },
    JSON.stringify(record.inspection_failures),
  );
  const found = (record.findings as { inspector_type: string; severity: string }[]).map(
    (f) => `${f.inspector_type}:${f.severity}`,
  );
  t.ok(found.includes('secrets:block'), 'the secret is found');
  t.ok(found.includes('api_key:block'), 'the key is found');
});

t.test(
  'an inspector that misses the deadline is named in the record; the block that finished still blocks',
  async (t) => {
    // The real worker, hanging once api_key has reported: pii, patterns and the normalized view never finish. (2 MB:
    // below the size where the patterns run on a second worker of their own.)
    const h = await startHarness({
      snapshot,
      proxy: { inspectTimeout: 1500 },
      inspectWorker: new URL('../../fixtures/faulty-worker.ts', import.meta.url),
    });
    t.teardown(() => h.close());
    await warm(h);
    const r = await post(h, padded('HANG-AFTER-api_key ', 2));
    t.equal(r.status, 403, 'a finished block is a policy match');
    const record = h.audit.at(-1)!;
    t.match(record, { status: 403, decision: 'block', inspection_failopen: true });
    t.same(record.inspection_failures, [
      { phase: 'request', inspector: 'pii', reason: 'timeout' },
      { phase: 'request', inspector: 'patterns', reason: 'timeout' },
      { phase: 'request', inspector: 'normalized_view', reason: 'timeout' },
    ]);
    t.same((record.findings as { inspector_type: string }[]).map((f) => f.inspector_type).sort(), [
      'api_key',
      'secrets',
    ]);
  },
);
