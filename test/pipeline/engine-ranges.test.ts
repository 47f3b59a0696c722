import t from 'tap';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine, MAX_BODY_BYTES, type EngineOptions } from '../../pipeline/engine.ts';
import { findingKey, type ScanResult } from '../../pipeline/scan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import type { Registry } from 'prom-client';

// A 32 MB request body through the real pool, cut into one byte range per worker: the same findings
// as the whole body scanned inline, leaks placed across the cut; a deadline keeps what each range
// finished; a custom pattern whose matches have no bound still finds a match spanning the cut.

const policyOf = (patterns: { pattern: string; description: string; severity: string }[]) =>
  policyFromDocument(
    validatePolicyDocument({
      model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
      content_inspection: {
        secrets_filter: { enabled: true },
        pii_detection: { enabled: true },
        api_key_detection: { enabled: true, severity: 'block' },
        patterns,
      },
    }),
  );
const bounded = policyOf([{ pattern: 'ticket:[0-9]{4}', description: 'ticket', severity: 'warn' }]);
const SECRETS = ['zebra:crossing-42'];

// Filler with a separator every 40 bytes or so, as prose and JSON have.
const FILLER = 'lorem ipsum dolor sit amet, consectetur adipiscing elit: sed do eiusmod tempor ';

/**
 * A body of `size` bytes whose first edge from the middle on (where two workers cut) is at `seam`'s
 * separator: `seam` is written so its `:` or `,` lands on the middle byte. `head` opens the content.
 */
function bodyWithSeam(size: number, head: string, seam: string, near: string): Buffer {
  const open = `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"${head} `;
  const close = ` tail@example.org"}]}`;
  const middle = Math.floor(size / 2);
  const sep = seam.search(/[:,]/);
  const before = middle - open.length - sep;
  const after = size - middle - close.length - (seam.length - sep) - near.length - 2;
  const fill = (n: number) => FILLER.repeat(Math.ceil(n / FILLER.length)).slice(0, n);
  const body = Buffer.from(open + fill(before) + seam + ' ' + near + ' ' + fill(after) + close);
  t.equal(body.length, size);
  t.equal(String.fromCharCode(body[middle]), seam[sep], 'the separator is the middle byte');
  return body;
}

function engine(t: { teardown: (fn: () => unknown) => void }, options: EngineOptions = {}) {
  const registry = createRegistry();
  const e = new InspectionEngine({ registry, timeoutMs: 60_000, ...options });
  t.teardown(() => e.close());
  return { e, registry };
}

async function splits(registry: Registry): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('dvx_inspection_pool_splits_total')!.get();
  return Object.fromEntries(metric.values.map((v) => [String(v.labels.split), v.value]));
}

const keys = (r: ScanResult) => r.findings.map(findingKey).sort();

t.test('a 32 MB body split by byte range finds what the whole body holds, across the cut', async (t) => {
  const { e, registry } = engine(t, { threads: 2 });
  const { e: inline } = engine(t, { threads: 0 });
  const near = 'seam@example.com AKIA\\u0049OSFODNN7EXAMPLE ticket:\\u200b4321, 4111 1111 1111 1111';
  const body = bodyWithSeam(MAX_BODY_BYTES, 'head@example.net 123-45-6789', 'zebra:crossing-42', near);
  const request = { body, phase: 'request' as const, policy: bounded, secrets: SECRETS };
  const split = await e.inspect(request);
  const whole = await inline.inspect(request);
  t.equal(split.mode, 'pool');
  t.strictSame(await splits(registry), { range: 1 }, 'cut into byte ranges');
  t.strictSame(split.failures, []);
  t.strictSame(keys(split), keys(whole));
  t.equal(split.decision, 'block');
  t.match(
    split.findings.map((f) => f.match).sort(),
    ['4111****', 'AKIA****', 'head****', 'seam****', 'tail****', 'tick****', 'zebr****', '123-****'].sort(),
    'the secret across the cut, the leaks in its overlap, and those far from it',
  );
  // The model is checked once: on the main thread first, or (models named anywhere: the pass-through
  // routes) by the first range's worker over the whole body.
  const denied = { ...request, body: Buffer.from(body.toString().replace('claude-sonnet-4-5', 'gpt-3.5-turbo-16')) };
  for (const modelsAnywhere of [undefined, { contentType: 'application/json' }]) {
    const out = await e.inspect({ ...denied, ...(modelsAnywhere ? { modelsAnywhere } : {}) });
    t.strictSame(
      out.findings.filter((f) => f.inspector_type === 'model_restriction').map((f) => f.match),
      ['gpt-****'],
      modelsAnywhere ? 'checked in the pool' : 'checked first',
    );
  }
  t.strictSame(await splits(registry), { range: 3 });
});

t.test('a match 2 MB long across the middle is found, split by range around its literal or by inspector', async (t) => {
  // The match runs from 1 MB before the cut to 1 MB after it: no overlap reaches that far.
  const mb = 'lorem ipsum '.repeat(87_382);
  const body = bodyWithSeam(16 * 1024 * 1024, 'x', `BEGIN ${mb.slice(-1_000_000)},${mb.slice(0, 1_000_000)}END`, 'y');
  for (const [pattern, split, match] of [
    // Unbounded but with a literal: each range looks around `BEGIN`, and the one holding it reads on
    // over the whole body (patterns.ts, OpenRange).
    ['BEGIN[a-z ]*,[a-z ]*END', 'range', 'BEGI****'],
    // No literal to look around: patterns | the rest, each over the whole body.
    ['[A-Z]{5}[a-z ]*[,;][a-z ]*[A-Z]{3}', 'inspector', 'BEGI****'],
  ] as const) {
    const policy = policyOf([{ pattern, description: 'span', severity: 'block' }]);
    const { e, registry } = engine(t, { threads: 2 });
    const { e: inline } = engine(t, { threads: 0 });
    const request = { body, phase: 'request' as const, policy, secrets: [] };
    const out = await e.inspect(request);
    const whole = await inline.inspect(request);
    t.strictSame(await splits(registry), { [split]: 1 }, `${pattern}: split by ${split}`);
    t.strictSame(keys(out), keys(whole));
    t.ok(
      out.findings.some((f) => f.inspector_type === 'patterns' && f.match === match),
      'the 2 MB match across the cut',
    );
    t.equal(out.decision, 'block');
  }
});

t.test('at the deadline each range reports what it finished', async (t) => {
  const { e } = engine(t, {
    threads: 2,
    timeoutMs: 3000,
    workerUrl: new URL('../fixtures/faulty-worker.ts', import.meta.url),
  });
  // Both ranges hang once api_key has reported: what secrets and api_key found in either range counts.
  const body = bodyWithSeam(8 * 1024 * 1024, 'HANG-AFTER-api_key', 'zebra:crossing-42', 'AKIAIOSFODNN7EXAMPLE');
  const out = await e.inspect({ body, phase: 'request', policy: bounded, secrets: SECRETS });
  t.equal(out.decision, 'block');
  t.strictSame(out.findings.map((f) => f.inspector_type).sort(), ['api_key', 'secrets']);
  t.strictSame(out.failures, [
    { inspector: 'pii', reason: 'timeout' },
    { inspector: 'patterns', reason: 'timeout' },
    { inspector: 'normalized_view', reason: 'timeout' },
  ]);
});
