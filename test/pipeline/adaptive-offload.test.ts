import { spawnSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
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

// On a process's only core the pool's thread would take its turns from the loop it was to relieve
// (bench/proxy.ts, one core per proxy: 64 KB bodies cost more per call offloaded than inline), so the
// default is off there; an explicit adaptiveOffload is still honoured.
async function lagUntilOn(e: InspectionEngine, windows: number): Promise<void> {
  for (let i = 0; i < windows && !e.offloading; i++) {
    for (let k = 0; k < 14; k++) {
      block(80);
      await sleep(1);
    }
    await sleep(50);
  }
}

t.test('the default needs a second core: on one it stays off however the loop lags', async (t) => {
  const one = new InspectionEngine({ registry: createRegistry(), threads: 1, cacheBytes: 0, cores: 1 });
  const two = new InspectionEngine({ registry: createRegistry(), threads: 1, cacheBytes: 0, cores: 2 });
  t.teardown(async () => {
    await one.close();
    await two.close();
  });
  // Both engines watch the same loop: it lags past the default 20 ms for more than a 1 s window.
  await lagUntilOn(two, 4);
  t.ok(two.offloading, 'two cores: on (the default thresholds)');
  t.notOk(one.offloading, 'one core: off');
  const mid = Buffer.from(
    JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `AKIAIOSFODNN7EXAMPLE ${'y'.repeat(20_000)}` }] }),
  );
  t.equal((await one.inspect({ body: mid, phase: 'request', policy })).mode, 'inline', 'a 20 KB body stays inline');
  t.equal((await two.inspect({ body: mid, phase: 'request', policy })).mode, 'pool', 'and goes to the pool on two');
});

t.test('an explicit adaptive offload is honoured on one core', async (t) => {
  const e = new InspectionEngine({
    registry: createRegistry(),
    threads: 1,
    cacheBytes: 0,
    cores: 1,
    adaptiveOffload: { thresholdBytes: 1024, highMs: 40, lowMs: 10, windowMs: 300 },
  });
  t.teardown(() => e.close());
  await lagUntilOn(e, 4);
  t.ok(e.offloading);
});

const noTaskset = spawnSync('taskset', ['--version']).error ? 'no taskset here' : false;
t.test(
  'a process pinned to one core (taskset) counts one core: no adaptive offload',
  { skip: noTaskset },
  async (t) => {
    const engineUrl = new URL('../../pipeline/engine.ts', import.meta.url).href;
    const script = `
    import { availableParallelism } from 'node:os';
    import { InspectionEngine } from ${JSON.stringify(engineUrl)};
    const e = new InspectionEngine({ threads: 1, cacheBytes: 0 });
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
    for (let i = 0; i < 3; i++) {
      for (let k = 0; k < 14; k++) { const end = performance.now() + 80; while (performance.now() < end) {} await sleep(1); }
      await sleep(50);
    }
    console.log(JSON.stringify({ cores: availableParallelism(), offloading: e.offloading }));
    await e.close();
  `;
    const run = (cores: string) => {
      const out = spawnSync('taskset', ['-c', cores, process.execPath, '--input-type=module', '-e', script], {
        encoding: 'utf8',
        timeout: 60_000,
      });
      t.equal(out.status, 0, out.stderr);
      return JSON.parse(out.stdout.trim().split('\n').pop()!) as { cores: number; offloading: boolean };
    };
    // The cores this test may use (a container's cpuset need not start at 0).
    const list = /list:\s*(\S+)/.exec(spawnSync('taskset', ['-cp', String(process.pid)], { encoding: 'utf8' }).stdout);
    const cpus = (list?.[1] ?? '0').split(',').flatMap((r) => {
      const [a, b = a] = r.split('-').map(Number);
      return Array.from({ length: b - a + 1 }, (_, i) => a + i);
    });
    t.same(run(String(cpus[0])), { cores: 1, offloading: false }, 'pinned to one core: off');
    if (cpus.length >= 2 && availableParallelism() >= 2)
      t.same(run(`${cpus[0]},${cpus[1]}`), { cores: 2, offloading: true }, 'on two cores: on');
  },
);
