import fc from 'fast-check';
import t from 'tap';
import { Counter, counter, createRegistry, gauge, histogram } from '../../core/metrics.ts';

t.test('counters render per label combination in the Prometheus text format', async (t) => {
  const registry = createRegistry();
  const c = counter(registry, 'dvx_calls_total', 'Calls', ['format', 'status']);
  c.inc({ format: 'openai-chat', status: '200' });
  c.inc({ status: '200', format: 'openai-chat' }, 2);
  c.inc({ format: 'openai-chat', status: '403' });
  const text = await registry.metrics();
  t.match(text, /# HELP dvx_calls_total Calls\n# TYPE dvx_calls_total counter/);
  t.match(text, /dvx_calls_total\{format="openai-chat",status="200"\} 3\n/);
  t.match(text, /dvx_calls_total\{format="openai-chat",status="403"\} 1/);
  t.equal(counter(registry, 'dvx_calls_total', 'Calls', ['format', 'status']), c, 'registered once, reused');
});

t.test('a counter refuses an unknown label, a negative or a non-finite increment', async (t) => {
  const registry = createRegistry();
  const c = counter(registry, 'dvx_x_total', 'x', ['a']);
  t.throws(() => c.inc({ b: '1' } as never), /no label "b"/);
  t.throws(() => c.inc({ a: '1' }, -1), /cannot add -1/);
  t.throws(() => c.inc({ a: '1' }, NaN), /cannot add NaN/);
  c.inc();
  t.match(
    await registry.metrics(),
    /^dvx_x_total 1$/m,
    'no labels: one unlabelled series, the refused updates left nothing',
  );
});

t.test('histograms keep cumulative buckets, +Inf, sum and count per label', async (t) => {
  const registry = createRegistry();
  const h = histogram(registry, 'dvx_latency_seconds', 'Latency', ['format'], [0.001, 0.01, 0.1]);
  for (const v of [0.0005, 0.001, 0.005, 0.05, 2]) h.observe({ format: 'a' }, v);
  h.observe({ format: 'b' }, 0.02);
  const text = await registry.getSingleMetricAsString('dvx_latency_seconds');
  t.match(text, /# TYPE dvx_latency_seconds histogram/);
  t.match(text, /dvx_latency_seconds_bucket\{format="a",le="0.001"\} 2\n/, 'a value on a bound falls in that bucket');
  t.match(text, /dvx_latency_seconds_bucket\{format="a",le="0.01"\} 3\n/);
  t.match(text, /dvx_latency_seconds_bucket\{format="a",le="0.1"\} 4\n/);
  t.match(text, /dvx_latency_seconds_bucket\{format="a",le="\+Inf"\} 5\n/);
  t.match(text, /dvx_latency_seconds_sum\{format="a"\} 2.0565\n/);
  t.match(text, /dvx_latency_seconds_count\{format="a"\} 5\n/);
  t.match(text, /dvx_latency_seconds_bucket\{format="b",le="0.01"\} 0\n/);
  t.match(text, /dvx_latency_seconds_count\{format="b"\} 1/);
  t.throws(() => h.observe({ format: 'a' }, Infinity), /cannot observe Infinity/);
});

t.test('gauges stay prom-client gauges on the same registry', async (t) => {
  const registry = createRegistry();
  gauge(registry, 'dvx_depth', 'Depth').set(4);
  t.match(await registry.metrics(), /dvx_depth 4/);
});

// Cells are found by their label values in turn (a Map per label), made by their joined key: the
// same cells, whatever the values (numbers, missing ones, a value holding the key's separator).
t.test('metrics: a cell found by its values is the one its joined key names', async (t) => {
  const value = fc.oneof(
    fc.constantFrom('request', 'response', '', 'a\u0000b', 'a', '1'),
    fc.constant(1),
    fc.constant(undefined),
  );
  const labels = fc.record({ phase: value, mode: value, decision: value }, { requiredKeys: [] });
  await fc.assert(
    fc.asyncProperty(fc.array(fc.tuple(labels, fc.integer({ min: 0, max: 3 })), { maxLength: 40 }), async (updates) => {
      const counter = new Counter('c', 'help', ['phase', 'mode', 'decision']);
      const want = new Map<string, number>();
      for (const [l, n] of updates) {
        counter.inc(l as Record<string, string>, n);
        const key = ['phase', 'mode', 'decision']
          .map((k) => String((l as Record<string, unknown>)[k] ?? ''))
          .join('\u0000');
        want.set(key, (want.get(key) ?? 0) + n);
      }
      const got = (await counter.get()).values.map((v) => v.value);
      return JSON.stringify(got) === JSON.stringify([...want.values()]);
    }),
    { numRuns: 300 },
  );
  t.pass("every cell as its joined key's");
});
