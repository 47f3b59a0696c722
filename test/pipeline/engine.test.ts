import t from 'tap';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { allocShared, InspectionEngine, MAX_INSPECTED_BYTES, type EngineOptions } from '../../pipeline/engine.ts';
import { closeSidecarDispatcher } from '../../pipeline/inspectors/sidecar.ts';
import { BodyTooLargeError } from '../../pipeline/errors.ts';
import { policyFromDocument, resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { startSidecarServer } from '../fixtures/sidecar-server.ts';

const sidecars = await startSidecarServer();
t.teardown(async () => {
  await closeSidecarDispatcher();
  await sidecars.close();
});

const FULL = {
  model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
  content_inspection: {
    secrets_filter: { enabled: true },
    pii_detection: { enabled: true },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: [{ pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' }],
  },
};
const policyOf = (doc: unknown) => policyFromDocument(validatePolicyDocument(doc));
const full = policyOf(FULL);

function body(content: string, pad = 0, model = 'claude-sonnet-4-5'): Buffer {
  return Buffer.from(
    JSON.stringify({ model, messages: [{ role: 'user', content: content + ' lorem ipsum'.repeat(pad) }] }),
  );
}

function engine(t: { teardown: (fn: () => unknown) => void }, options: EngineOptions = {}) {
  const lines: string[] = [];
  const registry = createRegistry();
  const e = new InspectionEngine({
    logger: createLogger({ destination: { write: (s: string) => void lines.push(s) } }),
    registry,
    ...options,
  });
  t.teardown(() => e.close());
  return { e, lines, registry };
}

/** Waits until the pool's thread has started (slow on a loaded machine), so deadlines measure scans. */
async function warm(e: InspectionEngine) {
  for (let i = 0; i < 10; i++) {
    if ((await e.inspect({ body: body('warm-up'), phase: 'request', policy: full })).failures.length === 0) return;
  }
}

const LEAKY = 'mail a@example.com key AKIAIOSFODNN7EXAMPLE secret hunter2hunter2 project-7';

t.test('an inert policy costs nothing', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const out = await e.inspect({ body: body(LEAKY), phase: 'request', policy: resolvePolicy({}) });
  t.same(out, { decision: 'allow', findings: [], failOpen: false, failures: [], mode: 'noop', durationMs: 0 });
});

t.test('inline and pool find the same things; the threshold picks the mode', async (t) => {
  const { e } = engine(t, { inlineThresholdBytes: 4096, threads: 1 });
  const small = await e.inspect({ body: body(LEAKY), phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  const large = await e.inspect({
    body: body(LEAKY, 1000),
    phase: 'request',
    policy: full,
    secrets: ['hunter2hunter2'],
  });
  t.equal(small.mode, 'inline');
  t.equal(large.mode, 'pool');
  t.same(large.findings, small.findings);
  t.same(small.findings.map((f) => f.inspector_type).sort(), ['api_key', 'patterns', 'pii', 'secrets']);
  t.equal(small.decision, 'block', 'the secret and the key block');
  const shared = allocShared(large.findings.length >= 0 ? body(LEAKY, 1000).length : 0);
  body(LEAKY, 1000).copy(shared);
  t.same(
    (await e.inspect({ body: shared, phase: 'request', policy: full, secrets: ['hunter2hunter2'] })).findings,
    small.findings,
    'a body already in shared memory',
  );
});

t.test('a large body is split across two workers (patterns | the rest) with the same findings', async (t) => {
  const { e } = engine(t, { threads: 2, inlineThresholdBytes: 4096 });
  const { e: inline } = engine(t, { threads: 0 });
  const big = body(LEAKY, 400_000);
  t.ok(big.length >= 4 * 1024 * 1024);
  const split = await e.inspect({ body: big, phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  const whole = await inline.inspect({ body: big, phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  t.equal(split.mode, 'pool');
  t.same(split.findings, whole.findings);
  t.same(split.failures, []);
});

t.test('request blocks; response is observe-only and runs secrets and patterns only', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const req = await e.inspect({ body: body('x', 0, 'gpt-3.5-turbo'), phase: 'request', policy: full });
  t.equal(req.decision, 'block');
  t.same(
    req.findings.map((f) => f.location),
    ['model'],
  );
  const res = await e.inspect({
    body: body(LEAKY, 0, 'gpt-3.5-turbo'),
    phase: 'response',
    policy: full,
    secrets: ['hunter2hunter2'],
  });
  t.equal(res.decision, 'allow', 'a block finding on the response is recorded, not enforced');
  t.same(
    res.findings.map((f) => [f.inspector_type, f.severity, f.location]),
    [
      ['secrets', 'block', 'response_body'],
      ['patterns', 'warn', 'response_body'],
    ],
  );
});

t.test('warn and log findings proceed', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const out = await e.inspect({
    body: body('a@example.com'),
    phase: 'request',
    policy: policyOf({ content_inspection: { pii_detection: { enabled: true, severity: 'warn' } } }),
  });
  t.equal(out.decision, 'allow');
  t.equal(out.findings.length, 1);
});

t.test('a hung worker is cut at the deadline and replaced; fail open by default', async (t) => {
  const { e, lines, registry } = engine(t, {
    threads: 1,
    inlineThresholdBytes: 0,
    timeoutMs: 1500,
    workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
  });
  await warm(e);
  const timeouts = async () =>
    Number(
      /reason="timeout"} (\d+)/.exec(await registry.getSingleMetricAsString('dvx_inspection_failopen_total'))?.[1] ?? 0,
    );
  const before = await timeouts();
  const started = Date.now();
  const out = await e.inspect({ body: body('HANG-WORKER ' + LEAKY), phase: 'request', policy: full });
  t.ok(Date.now() - started < 4000, 'not waited on');
  t.same([out.decision, out.failOpen, out.findings], ['allow', true, []]);
  t.same(
    out.failures,
    ['api_key', 'pii', 'patterns', 'normalized_view'].map((inspector) => ({ inspector, reason: 'timeout' })),
    'each inspector that did not finish is named (the model was checked first, on the main thread)',
  );
  t.ok(
    lines.some((l) => /"msg":"inspection failopen"/.test(l)),
    'the marker is logged',
  );
  t.equal(await timeouts(), before + 1, 'counted once');
  // The replacement thread starts in the background; on a loaded machine its start-up can outlast one
  // deadline, so give it a few. A hung worker that was not replaced would never serve again.
  let next = await e.inspect({ body: body(LEAKY), phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  for (let attempt = 0; attempt < 5 && next.failures.length > 0; attempt++) {
    next = await e.inspect({ body: body(LEAKY), phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  }
  t.equal(next.findings.length, 4, 'the single-thread pool serves again: the hung worker was replaced');
});

t.test(
  'a pooled inference body has its model checked before the pool: a hung worker cannot carry a denied model past the deadline',
  async (t) => {
    const { e } = engine(t, {
      threads: 1,
      inlineThresholdBytes: 0,
      timeoutMs: 1500,
      workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
    });
    await warm(e);
    const out = await e.inspect({ body: body('HANG-WORKER', 0, 'gpt-3.5-turbo'), phase: 'request', policy: full });
    t.equal(out.decision, 'block', 'blocked by the model, though the pool timed out');
    t.match(out.findings, [{ inspector_type: 'model_restriction', severity: 'block' }]);
    t.same(
      out.failures,
      ['api_key', 'pii', 'patterns', 'normalized_view'].map((inspector) => ({ inspector, reason: 'timeout' })),
    );
  },
);

t.test(
  'inspectors time out one by one: what finished counts, a finished block blocks, the rest are named',
  async (t) => {
    const { e, lines } = engine(t, {
      threads: 1,
      inlineThresholdBytes: 0,
      timeoutMs: 1500,
      workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
    });
    await warm(e);
    // The real inspectors run in order (model, secrets, api_key, pii, patterns, the normalized view); the
    // worker hangs once api_key has reported, so pii, patterns and the normalized view miss the deadline.
    const out = await e.inspect({
      body: body('HANG-AFTER-api_key ' + LEAKY),
      phase: 'request',
      policy: full,
      secrets: ['hunter2hunter2'],
    });
    t.equal(out.decision, 'block', 'the secret and the key that were found block');
    t.same(
      out.findings.map((f) => [f.inspector_type, f.severity]),
      [
        ['secrets', 'block'],
        ['api_key', 'block'],
      ],
    );
    t.same(out.failures, [
      { inspector: 'pii', reason: 'timeout' },
      { inspector: 'patterns', reason: 'timeout' },
      { inspector: 'normalized_view', reason: 'timeout' },
    ]);
    t.ok(
      lines.some((l) => /"msg":"inspection failopen"/.test(l) && /"inspector":"pii"/.test(l)),
      'the log names them',
    );

    const { e: closed } = engine(t, {
      threads: 1,
      inlineThresholdBytes: 0,
      timeoutMs: 1500,
      failClosed: true,
      workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
    });
    await warm(closed);
    const blocked = await closed.inspect({
      body: body('HANG-AFTER-secrets ' + LEAKY),
      phase: 'request',
      policy: full,
      secrets: ['hunter2hunter2'],
    });
    t.equal(blocked.decision, 'block', 'fail closed: a finished block is a policy match (403), not unavailable');
    t.same(
      blocked.failures.map((f) => f.inspector),
      ['api_key', 'pii', 'patterns', 'normalized_view'],
    );
    const unavailable = await closed.inspect({
      body: body('HANG-AFTER-secrets a@example.com'),
      phase: 'request',
      policy: full,
      secrets: ['hunter2hunter2'],
    });
    t.equal(unavailable.decision, 'unavailable', 'nothing blocked and an inspector did not finish: fail closed');
  },
);

t.test('split across two workers, each half reports what finished', async (t) => {
  const { e } = engine(t, {
    threads: 2,
    inlineThresholdBytes: 4096,
    timeoutMs: 3000,
    workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
  });
  await warm(e);
  const big = body('HANG-AFTER-secrets ' + LEAKY, 400_000);
  t.ok(big.length >= 4 * 1024 * 1024);
  const out = await e.inspect({ body: big, phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
  t.equal(out.decision, 'block');
  t.same(
    out.findings.map((f) => f.inspector_type).sort(),
    ['patterns', 'secrets'],
    'the patterns half finished, the others half got as far as secrets',
  );
  t.same(out.failures, [
    { inspector: 'api_key', reason: 'timeout' },
    { inspector: 'pii', reason: 'timeout' },
    { inspector: 'normalized_view', reason: 'timeout' },
  ]);
});

t.test(
  'a large body under a model policy alone is checked on the main thread, with no pool round trip for nothing',
  async (t) => {
    const { e } = engine(t, { threads: 1, inlineThresholdBytes: 0 });
    const modelOnly = policyOf({ model_policy: { mode: 'blocklist', models: ['gpt-3*'] } });
    const denied = await e.inspect({ body: body('hi', 0, 'gpt-3.5-turbo'), phase: 'request', policy: modelOnly });
    t.match(denied, { decision: 'block', mode: 'inline', findings: [{ inspector_type: 'model_restriction' }] });
    const allowed = await e.inspect({ body: body('hi'), phase: 'request', policy: modelOnly });
    t.match(allowed, { decision: 'allow', mode: 'inline', findings: [] });
    const withContent = await e.inspect({ body: body('hi', 0, 'gpt-3.5-turbo'), phase: 'request', policy: full });
    t.match(withContent, { decision: 'block', mode: 'pool' }, 'other inspectors still go to the pool');
    t.equal(
      withContent.findings.filter((f) => f.inspector_type === 'model_restriction').length,
      1,
      'the model reported once',
    );
  },
);

t.test('fail closed: a failed or late inspection is unavailable, a known block still blocks', async (t) => {
  const { e, lines, registry } = engine(t, {
    threads: 1,
    inlineThresholdBytes: 0,
    timeoutMs: 1500,
    failClosed: true,
    workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
  });
  await warm(e);
  const crashed = await e.inspect({ body: body('CRASH-WORKER'), phase: 'request', policy: full });
  t.equal(crashed.decision, 'unavailable');
  t.match(crashed.failures[0].reason, /inspector exploded/);
  const hung = await e.inspect({ body: body('HANG-WORKER'), phase: 'request', policy: full });
  t.same([hung.decision, hung.failOpen], ['unavailable', false]);
  t.ok(lines.some((l) => /inspection unavailable/.test(l)));
  t.match(await registry.getSingleMetricAsString('dvx_inspection_failclosed_total'), /reason="timeout"} [1-9]/);
  const response = await e.inspect({
    body: body('CRASH-WORKER'),
    phase: 'response',
    policy: full,
    secrets: ['hunter2hunter2'],
  });
  t.same([response.decision, response.failOpen], ['allow', true], 'the response path never refuses');
  const withSidecar = policyOf({
    ...FULL,
    sidecar_inspection: {
      sidecars: [{ name: 'judge', url: sidecars.url('/good'), on_request: true, severity: 'block' }],
    },
  });
  const blocked = await e.inspect({ body: body('CRASH-WORKER'), phase: 'request', policy: withSidecar });
  t.equal(blocked.decision, 'block', 'the sidecar that did answer blocks: a 403 is a policy match');
});

t.test('sidecars: findings merge, faults fail open even when fail-closed, the deadline cuts them', async (t) => {
  const { e, registry } = engine(t, { threads: 0, timeoutMs: 400, failClosed: true });
  const policy = policyOf({
    content_inspection: { pii_detection: { enabled: true } },
    sidecar_inspection: {
      sidecars: [
        { name: 'good', url: sidecars.url('/good'), on_request: true },
        { name: 'hang', url: sidecars.url('/hang'), on_request: true, timeout_ms: 5000 },
        { name: 'err', url: sidecars.url('/error'), on_request: true },
        { name: 'junk', url: sidecars.url('/garbage'), on_request: true },
        { name: 'big', url: sidecars.url('/huge'), on_request: true },
        { name: 'resp-only', url: sidecars.url('/good'), on_response: true },
      ],
    },
  });
  const started = Date.now();
  const out = await e.inspect({
    body: body('a@example.com'),
    phase: 'request',
    policy,
    identity: { agentId: '1', orgId: '2', agentName: 'n' },
  });
  t.ok(Date.now() - started < 2000, 'the hanging sidecar is cut at the run deadline');
  t.equal(out.decision, 'allow');
  t.ok(out.failOpen);
  t.same(out.findings.map((f) => f.inspector_type).sort(), ['pii', 'sidecar:good']);
  t.same(out.failures.map((f) => `${f.inspector}:${f.reason}`).sort(), [
    'sidecar:big:too_large',
    'sidecar:err:status',
    'sidecar:hang:deadline',
    'sidecar:junk:bad_json',
  ]);
  t.match(
    await registry.getSingleMetricAsString('dvx_inspection_failopen_total'),
    /inspector="sidecar:junk",reason="bad_json"} 1/,
  );
});

t.test('async sidecars never hold the call; their findings arrive later', async (t) => {
  const arrived: unknown[] = [];
  let done: () => void;
  const got = new Promise<void>((r) => (done = r));
  const { e } = engine(t, {
    threads: 0,
    onAsyncFindings: (findings, meta) => {
      arrived.push({ findings, meta });
      done();
    },
  });
  const policy = policyOf({
    sidecar_inspection: {
      sidecars: [
        { name: 'slow', url: sidecars.url('/hang'), on_request: true, async: true, timeout_ms: 200 },
        { name: 'later', url: sidecars.url('/good'), on_request: true, async: true, severity: 'block' },
      ],
    },
  });
  const out = await e.inspect({ body: body('hello'), phase: 'request', policy });
  t.same([out.decision, out.findings], ['allow', []], 'async findings never block');
  await got;
  t.match(arrived[0], {
    meta: { sidecar: 'later', phase: 'request' },
    findings: [{ inspector_type: 'sidecar:later', severity: 'block' }],
  });
});

t.test('bodies past 32 MB (plus the prefix headroom) are refused', async (t) => {
  const { e } = engine(t, { threads: 0 });
  await t.rejects(
    e.inspect({ body: Buffer.alloc(MAX_INSPECTED_BYTES + 1), phase: 'request', policy: full }),
    BodyTooLargeError,
  );
});

t.test('invalid custom patterns and malformed globs are logged once per policy version', async (t) => {
  const { e, lines } = engine(t, { threads: 0 });
  const policy = policyOf({
    model_policy: { mode: 'blocklist', models: ['['] },
    content_inspection: { patterns: [{ pattern: '(?<=a)b' }] },
  });
  await e.inspect({ body: body('ab'), phase: 'request', policy });
  await e.inspect({ body: body('ab'), phase: 'request', policy });
  t.equal(lines.filter((l) => /invalid custom pattern skipped/.test(l)).length, 1);
  t.equal(lines.filter((l) => /malformed model glob/.test(l)).length, 1);
});

t.test(
  'the deadline runs from when a worker starts the scan: a crowded pool does not fail a scan open before it ran',
  async (t) => {
    // One thread, three scans ahead that hang until their own deadline (1 s each): the leaky body waits
    // ~3 s for the worker. Counted from the request, its deadline passed while it queued, and it went
    // through with nothing inspected (fail open).
    const { e } = engine(t, {
      threads: 1,
      inlineThresholdBytes: 0,
      timeoutMs: 1000,
      workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
    });
    await warm(e);
    const ahead = [1, 2, 3].map(() => e.inspect({ body: body('HANG-WORKER'), phase: 'request', policy: full }));
    const leaky = await e.inspect({ body: body(LEAKY), phase: 'request', policy: full, secrets: ['hunter2hunter2'] });
    t.equal(leaky.decision, 'block', 'scanned once it reached the worker, and blocked');
    t.same(leaky.failures, []);
    t.same(
      (await Promise.all(ahead)).map((o) => o.failures.some((f) => f.reason === 'timeout')),
      [true, true, true],
      'the hung ones still time out, each on its own deadline',
    );

    // The wait for a worker has its own bound: past it the scan did not run, and says so.
    const { e: short } = engine(t, {
      threads: 1,
      inlineThresholdBytes: 0,
      timeoutMs: 1000,
      queueTimeoutMs: 500,
      failClosed: true,
      workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
    });
    await warm(short);
    const hung = short.inspect({ body: body('HANG-WORKER'), phase: 'request', policy: full });
    const queued = await short.inspect({
      body: body(LEAKY),
      phase: 'request',
      policy: full,
      secrets: ['hunter2hunter2'],
    });
    t.equal(queued.decision, 'unavailable', 'fail closed: a scan that never ran is a 503, never a pass');
    t.ok(
      queued.failures.length > 0 && queued.failures.every((f) => f.reason === 'queue_timeout'),
      'every inspector named, as queue_timeout',
    );
    await hung;
  },
);
