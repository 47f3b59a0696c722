import t from 'tap';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// Adaptive offload: while the event loop falls behind, bodies from a smaller size go to the pool; once
// it keeps up again, they are scanned inline as before (engine.ts, #watchLag). The loop is made to
// fall behind for real, by blocking it; nothing here measures speed.

const policy = policyFromDocument(
  validatePolicyDocument({ content_inspection: { api_key_detection: { enabled: true, severity: 'block' } } }),
);
const body = Buffer.from(
  JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: `key AKIAIOSFODNN7EXAMPLE ${'x '.repeat(2000)}` }],
  }),
);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function block(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {}
}

async function gauge(registry: ReturnType<typeof createRegistry>, name: string): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  return m?.values[0]?.value ?? 0;
}

t.test('a lagging loop sends smaller bodies to the pool, and stops once it keeps up', async (t) => {
  const registry = createRegistry();
  const e = new InspectionEngine({
    registry,
    threads: 1,
    cacheBytes: 0,
    timeoutMs: 30_000,
    adaptiveOffload: { thresholdBytes: 1024, highMs: 40, lowMs: 10, windowMs: 300 },
  });
  t.teardown(() => e.close());
  const calm = await e.inspect({ body, phase: 'request', policy });
  t.equal(calm.mode, 'inline', 'below the inline threshold: inline');
  t.equal(calm.decision, 'block');

  // Blocked for 80 ms at a time over more than a window: the delay's p99 is far past highMs.
  for (let i = 0; i < 2 && !e.offloading; i++) {
    for (let k = 0; k < 6; k++) {
      block(80);
      await sleep(1);
    }
    await sleep(350);
  }
  t.ok(e.offloading, 'on');
  t.equal(await gauge(registry, 'dvx_inspection_adaptive_offload'), 1);
  t.ok((await gauge(registry, 'dvx_inspection_adaptive_offload_switches_total')) >= 1);
  const lagging = await e.inspect({ body, phase: 'request', policy });
  t.equal(lagging.mode, 'pool', 'the same body now goes to the pool');
  t.same(lagging.findings, calm.findings, 'and finds the same');

  // Idle: the delay drops under lowMs within a window or two.
  for (let i = 0; i < 20 && e.offloading; i++) await sleep(150);
  t.notOk(e.offloading, 'off again');
  t.equal(await gauge(registry, 'dvx_inspection_adaptive_offload'), 0);
  t.equal((await e.inspect({ body, phase: 'request', policy })).mode, 'inline');
});

t.test('off without a pool, or when asked', async (t) => {
  for (const options of [{ threads: 0 }, { threads: 1, adaptiveOffload: null }]) {
    const e = new InspectionEngine({ registry: createRegistry(), ...options });
    t.teardown(() => e.close());
    block(200);
    await sleep(1100);
    t.notOk(e.offloading);
  }
});
