import t from 'tap';
import { performance } from 'node:perf_hooks';
import { WORST_CASES, WORST_PATTERNS, WORST_SECRET, worstBody } from '../../../bench/worst-case.ts';
import { MAX_FINDINGS_PER_INSPECTOR, type Phase } from '../../../pipeline/finding.ts';
import { InspectionInput, type InspectorFailure } from '../../../pipeline/inspection-input.ts';
import type { Inspector } from '../../../pipeline/inspector.ts';
import { id as PATTERNS, type PatternPlan } from '../../../pipeline/inspectors/patterns.ts';
import { INSPECTORS } from '../../../pipeline/inspectors/registry.ts';
import { compilePlan } from '../../../pipeline/plan.ts';
import { policyFromDocument } from '../../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../../pipeline/policy/validate.ts';
import { scanBody, type ScanResult } from '../../../pipeline/scan.ts';

// The contract every inspector of the registry keeps (docs/decisions.md, "The inspector contract"):
// a known hit is found and reported redacted (the matched value never appears in what the scan
// returns), findings stay bounded under a flood of distinct hits, a throw is a recorded failure (never a
// pass) in the result and in the pool's per-inspector report, and the scan is linear on the inspector's
// worst case (bench/worst-case.ts): time(4n) / time(n) well under the 16 a quadratic scan would show.
// No absolute timings are asserted.

interface Case {
  policy: Record<string, unknown>;
  phase: Phase;
  secrets: string[];
  /** A body holding one hit, and the value that must never appear unredacted. */
  hit: { body: Buffer; value: string };
  /** A body holding `n` distinct hits (and the agent's secrets for it). */
  flood: (n: number) => { body: Buffer; secrets?: string[] };
  /** Worst-case bodies of about `size` bytes, each with its phase. */
  worst: (size: number) => { name: string; body: Buffer; phase: Phase }[];
}

const request = (content: string) =>
  Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content }] }));
const range = (n: number) => Array.from({ length: n }, (_, i) => i);
const worstOf = (inspector: string) => (size: number) =>
  WORST_CASES.filter((c) => c.inspector === inspector).map((c) => ({
    name: c.name,
    body: worstBody(c, size),
    phase: c.phase,
  }));
const key = (i: number) => `AKIA${i.toString(36).toUpperCase().padStart(16, 'Q')}`;
const secretOf = (i: number) => `agent-secret-${String(i).padStart(6, '0')}`;

const CASES: Record<string, Case> = {
  model_restriction: {
    policy: { model_policy: { mode: 'allowlist', models: ['claude-*'] } },
    phase: 'request',
    secrets: [],
    hit: { body: Buffer.from(JSON.stringify({ model: 'gpt-4o-mini', messages: [] })), value: 'gpt-4o-mini' },
    // Every letter case of `model` is read; one finding says the call is refused.
    flood: (n) => ({
      body: Buffer.from(
        `{${range(n)
          .map((i) => `"${i % 2 ? 'Model' : 'model'}":"gpt-${i}"`)
          .join(',')}}`,
      ),
    }),
    // The top level is walked once however many keys and however long the values.
    worst: (size) => [
      {
        name: 'many top-level keys',
        body: Buffer.from(
          `{${range(Math.floor(size / 16))
            .map((i) => `"k${i}":"vvvv",`)
            .join('')}"model":"claude-x"}`,
        ),
        phase: 'request',
      },
      {
        name: 'one long value before the model',
        body: Buffer.from(`{"messages":"${'x'.repeat(size)}","model":"claude-x"}`),
        phase: 'request',
      },
    ],
  },
  secrets: {
    policy: { content_inspection: { secrets_filter: { enabled: true, severity: 'block' } } },
    phase: 'request',
    secrets: [WORST_SECRET],
    hit: { body: request(`the password is ${WORST_SECRET}`), value: WORST_SECRET },
    flood: (n) => ({ body: request(range(n).map(secretOf).join(' ')), secrets: range(n).map(secretOf) }),
    worst: worstOf('secrets'),
  },
  api_key: {
    policy: { content_inspection: { api_key_detection: { enabled: true, severity: 'block' } } },
    phase: 'request',
    secrets: [],
    hit: { body: request('key AKIAIOSFODNN7EXAMPLE here'), value: 'AKIAIOSFODNN7EXAMPLE' },
    flood: (n) => ({ body: request(range(n).map(key).join(' ')) }),
    worst: worstOf('api_key'),
  },
  pii: {
    policy: { content_inspection: { pii_detection: { enabled: true, severity: 'warn' } } },
    phase: 'request',
    secrets: [],
    hit: { body: request('mail jane.doe@example.com today'), value: 'jane.doe@example.com' },
    flood: (n) => ({
      body: request(
        range(n)
          .map((i) => `user${i}@example.com`)
          .join(' '),
      ),
    }),
    worst: worstOf('pii'),
  },
  patterns: {
    policy: { content_inspection: { patterns: WORST_PATTERNS } },
    phase: 'request',
    secrets: [],
    hit: { body: request('see INC-123456 now'), value: 'INC-123456' },
    flood: (n) => ({
      body: request(
        range(n)
          .map((i) => `INC-${String(100000 + i)}`)
          .join(' '),
      ),
    }),
    worst: worstOf('patterns'),
  },
};

const policyOf = (c: Case) => policyFromDocument(validatePolicyDocument(c.policy));
type Report = (id: string, r: ScanResult) => void;
function scan(inspectors: readonly Inspector<unknown>[], c: Case, body: Buffer, phase = c.phase, onInspector?: Report) {
  const plan = compilePlan(policyOf(c), inspectors);
  return scanBody(plan, { body, phase, secrets: c.secrets, ...(onInspector ? { onInspector } : {}) });
}

/** The fastest of a few runs: the least disturbed by whatever else the machine is doing. */
function fastest(run: () => unknown, runs = 5): number {
  let best = Infinity;
  for (let i = 0; i < runs; i++) {
    const started = performance.now();
    run();
    best = Math.min(best, performance.now() - started);
  }
  return best;
}

t.test('every inspector of the registry has a conformance case', async (t) => {
  t.same(
    INSPECTORS.map((i) => i.id).filter((id) => !(id in CASES)),
    [],
  );
  t.equal(new Set(INSPECTORS.map((i) => i.id)).size, INSPECTORS.length, 'ids are unique');
});

for (const inspector of INSPECTORS) {
  const c = CASES[inspector.id];
  if (!c) continue;
  const only = [inspector];

  t.test(`${inspector.id}: a policy that leaves it off compiles to nothing`, async (t) => {
    t.equal(inspector.compile(policyFromDocument(validatePolicyDocument({})), { prefilters: [] }), null);
    t.same(compilePlan(policyFromDocument(validatePolicyDocument({})), only).inspectors, []);
  });

  t.test(`${inspector.id}: a known hit is found, redacted`, async (t) => {
    const out = scan(only, c, c.hit.body);
    t.same(out.failures, []);
    const mine = out.findings.filter((f) => f.inspector_type === inspector.id);
    t.ok(mine.length > 0, 'found');
    for (const f of mine) t.match(f.match, /^.{0,4}\*\*\*\*$/u, 'first 4 characters and ****');
    t.notOk(JSON.stringify(out).includes(c.hit.value), 'the value itself appears nowhere in the result');
  });

  t.test(`${inspector.id}: findings stay bounded under a flood of distinct hits`, async (t) => {
    // Read from the inspector itself: the scanner's own merge would hide an unbounded list, since
    // redacted matches that share their first 4 characters are one finding to it.
    const { body, secrets = c.secrets } = c.flood(1000);
    const plan = compilePlan(policyOf(c), only);
    const failures: InspectorFailure[] = [];
    const { compiled } = plan.inspectors[0];
    // (The custom patterns read their candidates from the input's set pass, which needs their plan.)
    const patterns = inspector.id === PATTERNS ? (compiled as PatternPlan) : null;
    const input = new InspectionInput({
      raw: body,
      phase: c.phase,
      secrets,
      modelsAnywhere: null,
      failures,
      normalizeDecoded: false,
      patterns,
    });
    const found = inspector.scan(input, compiled);
    t.ok(found.length > 0, 'found');
    t.ok(found.length <= MAX_FINDINGS_PER_INSPECTOR, `${found.length} ≤ ${MAX_FINDINGS_PER_INSPECTOR}`);
    t.same(failures, []);
    const out = scanBody(plan, { body, phase: c.phase, secrets });
    t.ok(out.findings.length > 0 && out.findings.length <= MAX_FINDINGS_PER_INSPECTOR, 'and through the scanner');
  });

  t.test(`${inspector.id}: a throw is a recorded failure, never a pass`, async (t) => {
    const boom = () => {
      throw new Error('inspector exploded');
    };
    const failing: Inspector<unknown>[] = [{ ...inspector, scan: boom }];
    if (inspector.scanNormalized) failing.push({ ...inspector, scanNormalized: boom });
    for (const broken of failing) {
      const reports: [string, ScanResult][] = [];
      const out = scan([broken], c, c.hit.body, c.phase, (id, r) => reports.push([id, r]));
      t.same(out.failures, [{ inspector: inspector.id, reason: 'inspector exploded' }], 'recorded in the result');
      const failed = reports.filter(([, r]) => r.failures.some((f) => f.inspector === inspector.id));
      t.equal(failed.length, 1, 'and in exactly one of the reports a pool worker posts');
    }
  });

  t.test(`${inspector.id}: linear on its worst case`, async (t) => {
    const n = 1024 * 1024;
    const cases = c.worst(n);
    t.ok(cases.length > 0, 'it has a worst case');
    for (const w of cases) {
      const large = c.worst(4 * n).find((x) => x.name === w.name)!;
      const plan = compilePlan(policyOf(c), only);
      const run = (body: Buffer) => () => scanBody(plan, { body, phase: w.phase, secrets: c.secrets });
      run(w.body)(); // warm up
      // A busy machine can slow one measurement: a few attempts, the best kept. A quadratic scan stays
      // near 16 however often it is measured.
      let ratio = Infinity;
      for (let attempt = 0; attempt < 5 && ratio >= 10; attempt++) {
        ratio = Math.min(ratio, fastest(run(large.body)) / Math.max(fastest(run(w.body)), 0.05));
      }
      t.ok(ratio < 10, `${w.name}: time(4n) / time(n) = ${ratio.toFixed(1)} (< 10)`);
    }
  });
}
