import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  BENCH_PATTERNS,
  BENCH_SECRETS,
  FULL_SET_DOCUMENT,
  llmRequestBody,
  withNormalizedEvery,
  withOneNormalized,
} from './corpus.ts';
import { WORST_CASES, WORST_PATTERNS, WORST_SECRET, combinedWorstBody, worstBody } from './worst-case.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { formatMs, mbPerSec, measure, sizeLabel, table } from './measure.ts';
import { allocShared, DEFAULT_INLINE_THRESHOLD_BYTES, InspectionEngine } from '../pipeline/engine.ts';
import { compilePlan } from '../pipeline/plan.ts';
import { scanBody } from '../pipeline/scan.ts';
import { deepScanView } from '../pipeline/json-view.ts';
import type { PatternPlan } from '../pipeline/inspectors/patterns.ts';
import { locate } from '../pipeline/pattern-anchors.ts';
import { policyFromDocument } from '../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../pipeline/policy/validate.ts';
import { normalizedViewTable } from './normalized-view.ts';
import { hiddenControlScan } from '../pipeline/hidden-controls.ts';
import { jsonEscapesDecoder } from '../pipeline/json-escapes.ts';

/** Which byte loops run (WebAssembly SIMD, or their JS fallbacks where the CPU cannot): the tables say. */
const BYTE_LOOPS = `byte loops: hidden controls ${hiddenControlScan}, JSON escapes ${jsonEscapesDecoder}`;

// npm run bench -- pipeline [--quick] [--worst-only] [--scan-only] [--against DIR]
// Throughput of each inspector and of the full set (all built-ins + 10 RE2 patterns) on LLM-like JSON
// bodies of 4 KB, 64 KB, 1 MB and 32 MB; inline vs pool; p50/p99 of a 4 KB request-phase run; side by
// side with the floor (Buffer.indexOf), V8 RegExp on the same patterns, and the npm peers redact-pii and
// @openai/guardrails (PII check) on the same bodies. Then each inspector on its own worst case
// (bench/worst-case.ts), and every worst case in one 32 MB body through the engine, against the
// default --inspect-timeout. --scan-only: the single-core scan alone (the full set inline, each
// inspector, and the two passes it cannot go below: the decoded view and one RE2.Set pass over it).
// --against DIR: the full set and the patterns, inline and through a 2-worker engine, against another
// checkout's pipeline (DIR holds its pipeline/ and core/, e.g. `git archive <commit> pipeline core`),
// the two run in turn in this one process, so both see the same load.

const require = createRequire(import.meta.url);

/**
 * A body as llmproxy and the gateway hand it to the engine: one of DEFAULT_INLINE_THRESHOLD_BYTES or
 * more (with its content-length, as the SDKs send it) is read straight into shared memory
 * (proxy/llm/read-body.ts), so the pool takes it without a copy; a smaller one is a plain Buffer.
 */
function asRead(body: Buffer): Buffer {
  if (body.length < DEFAULT_INLINE_THRESHOLD_BYTES) return body;
  const shared = allocShared(body.length);
  body.copy(shared);
  return shared;
}

const FULL = validatePolicyDocument(FULL_SET_DOCUMENT);
const full = policyFromDocument(FULL);
const fullPlan = compilePlan(full);
const only = (content: Record<string, unknown>, model = false) =>
  compilePlan(
    policyFromDocument(
      validatePolicyDocument({ ...(model ? { model_policy: FULL.model_policy } : {}), content_inspection: content }),
    ),
  );
const PLANS = {
  model_restriction: only({}, true),
  secrets: only({ secrets_filter: { enabled: true } }),
  pii: only({ pii_detection: { enabled: true } }),
  api_key: only({ api_key_detection: { enabled: true } }),
  'patterns (10 RE2)': only({ patterns: BENCH_PATTERNS }),
};

// The same detections written as V8 regular expressions (what a naive implementation runs).
const V8_BUILTINS = [
  /[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}/g,
  /\b(?:\d[ -]?){12,18}\d\b/g,
  /\b\d{3}-\d{2}-\d{4}\b/g,
  /\b(?:AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}|gh[ps]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,}|sk-ant-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}|[sp]k_(?:test|live)_[A-Za-z0-9]{16,})/g,
];
const V8_PATTERNS = BENCH_PATTERNS.map(
  (p) => new RegExp(p.pattern.replace('(?i)', ''), p.pattern.startsWith('(?i)') ? 'gi' : 'g'),
);
function v8Scan(regexes: RegExp[], body: Buffer): number {
  const text = body.toString('utf8');
  let n = 0;
  for (const r of regexes) {
    r.lastIndex = 0;
    while (r.exec(text) !== null) n++;
  }
  return n;
}

export async function main(args: string[]): Promise<void> {
  const quick = args.includes('--quick');
  if (args.includes('--worst-only')) {
    process.stdout.write((await worstCases(quick)) + '\n');
    return;
  }
  if (args.includes('--scan-only')) {
    process.stdout.write((await scanOnly(quick)) + '\n');
    return;
  }
  const against = args.indexOf('--against');
  if (against >= 0) {
    if (!args[against + 1]) throw new Error('--against needs a directory holding the baseline pipeline/ and core/');
    process.stdout.write((await againstBaseline(resolve(args[against + 1]), quick)) + '\n');
    return;
  }
  const sizes = [4 * 1024, 64 * 1024, 1024 * 1024, 32 * 1024 * 1024];
  const bodies = new Map(sizes.map((s) => [s, llmRequestBody(s)]));
  const budget = quick ? 300 : 1500;

  const { SyncRedactor } = require('redact-pii') as { SyncRedactor: new (o: unknown) => { redact(s: string): string } };
  const off = { enabled: false };
  const redactor = new SyncRedactor({
    builtInRedactors: {
      names: off,
      streetAddress: off,
      zipcode: off,
      phoneNumber: off,
      ipAddress: off,
      username: off,
      password: off,
      credentials: off,
      digits: off,
      url: off,
    },
  });
  const guardrails = require('@openai/guardrails') as {
    pii: (ctx: unknown, text: string, cfg: unknown) => Promise<unknown>;
  };
  const guardCfg = { entities: ['EMAIL_ADDRESS', 'CREDIT_CARD', 'US_SSN'], block: true };

  const inline = new InspectionEngine({ threads: 0 });
  const pool = new InspectionEngine({ threads: 1, inlineThresholdBytes: 0, timeoutMs: 60_000 });
  const pool2 = new InspectionEngine({ threads: 2, inlineThresholdBytes: 0, timeoutMs: 60_000 });
  const needle = Buffer.from('\u0000no-such-needle\u0000');
  const rows: string[][] = [];
  const oursFull = new Map<number, number>();

  for (const size of sizes) {
    const body = bodies.get(size)!;
    const read = asRead(body);
    const normalizable = withOneNormalized(body);
    const large = size >= 32 * 1024 * 1024;
    const b = large ? Math.max(budget, 3000) : budget;
    const peerRuns = { budgetMs: large ? 1 : b, minRuns: large ? 1 : 5, warmup: large ? 0 : 3 };
    const contenders: [string, () => unknown, typeof peerRuns?][] = [
      ['floor: Buffer.indexOf', () => body.indexOf(needle)],
      ['ours: full set, inline', () => scanBody(fullPlan, { body, phase: 'request', secrets: BENCH_SECRETS })],
      [
        'ours: full set, inline, one "…" in the body',
        () => scanBody(fullPlan, { body: normalizable, phase: 'request', secrets: BENCH_SECRETS }),
      ],
      [
        'ours: full set, pool (1 worker)',
        () => pool.inspect({ body: read, phase: 'request', policy: full, secrets: BENCH_SECRETS }),
      ],
      [
        'ours: full set, pool (2 workers; split from 4 MB)',
        () => pool2.inspect({ body: read, phase: 'request', policy: full, secrets: BENCH_SECRETS }),
      ],
      ...Object.entries(PLANS).map(([name, plan]): [string, () => unknown] => [
        `ours: ${name}`,
        () => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }),
      ]),
      ['V8 RegExp: same 10 patterns', () => v8Scan(V8_PATTERNS, body), peerRuns],
      ['V8 RegExp: built-ins + 10 patterns', () => v8Scan([...V8_BUILTINS, ...V8_PATTERNS], body), peerRuns],
      ['peer: redact-pii (email, card, ssn)', () => redactor.redact(body.toString('utf8')), peerRuns],
      ['peer: @openai/guardrails pii', () => guardrails.pii(null, body.toString('utf8'), guardCfg), peerRuns],
    ];
    for (const [name, fn, runs] of contenders) {
      const s = await measure(fn, runs ?? { budgetMs: b });
      const mbs = mbPerSec(body.length, s.p50);
      if (name === 'ours: full set, inline') oursFull.set(size, s.p50);
      const ratio = oursFull.has(size) ? (s.p50 / oursFull.get(size)!).toFixed(2) + '×' : '';
      rows.push([sizeLabel(size), name, mbs.toFixed(0), formatMs(s.p50), formatMs(s.p99), String(s.n), ratio]);
    }
  }
  // The floor row came before ours: fill its ratio now.
  for (const r of rows)
    if (r[6] === '') {
      const size = sizes.find((s) => sizeLabel(s) === r[0])!;
      r[6] = ((parseFloat(r[3]) * (r[3].endsWith('µs') ? 0.001 : 1)) / oursFull.get(size)!).toFixed(2) + '×';
    }

  // Request-phase latency of a 4 KB body through the engine (what the proxy pays per call).
  const small = bodies.get(4 * 1024)!;
  const lat = await measure(
    () => inline.inspect({ body: small, phase: 'request', policy: full, secrets: BENCH_SECRETS }),
    { budgetMs: quick ? 500 : 3000, minRuns: 2000 },
  );

  // Inline vs pool crossover: where a pool round trip starts to beat blocking the event loop.
  const cross: string[][] = [];
  for (const size of [4 * 1024, 32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024, 1024 * 1024]) {
    const body = llmRequestBody(size, 7);
    const i = await measure(() => inline.inspect({ body, phase: 'request', policy: full, secrets: BENCH_SECRETS }), {
      budgetMs: budget,
    });
    const read = asRead(body);
    const p = await measure(
      () => pool.inspect({ body: read, phase: 'request', policy: full, secrets: BENCH_SECRETS }),
      {
        budgetMs: budget,
      },
    );
    cross.push([sizeLabel(size), formatMs(i.p50), formatMs(p.p50), formatMs(p.p50 - i.p50)]);
  }
  await inline.close();
  await pool.close();
  await pool2.close();

  const out = [
    `## pipeline — ${conditions(`${BYTE_LOOPS}; bodies: generated LLM-like JSON (bench/corpus.ts), request phase; the pool rows take a body from 128 KB in shared memory, as llmproxy reads one; ratio = p50 time / ours full-set inline p50 (lower is faster)`, UNPINNED)}`,
    '',
    table(['body', 'contender', 'MB/s (p50)', 'p50', 'p99', 'runs', 'time vs ours'], rows),
    '',
    `4 KB request-phase run through the engine (inline, full set): p50 ${formatMs(lat.p50)}, p99 ${formatMs(lat.p99)} over ${lat.n} runs.`,
    '',
    table(['body', 'inline p50', 'pool p50', 'pool overhead'], cross),
    '',
    await worstCases(quick),
  ].join('\n');
  process.stdout.write(out + '\n');
  // Evasion: what the normalized view costs, and its own worst cases (bench/normalized-view.ts).
  process.stdout.write((await normalizedViewTable(quick)) + '\n');
}

/**
 * Each inspector alone on its own worst case (8 MB), against V8 RegExp running the same detection
 * (the baseline a naive implementation is) and, for PII, redact-pii; then every worst case in one
 * 32 MB body through the engine (two workers, as deployed) and the padding attack (docs/decisions.md,
 * "Padding no longer turns fail-open into a bypass").
 */
async function worstCases(quick: boolean): Promise<string> {
  const { SyncRedactor } = require('redact-pii') as { SyncRedactor: new (o: unknown) => { redact(s: string): string } };
  const off = { enabled: false };
  const redactor = new SyncRedactor({
    builtInRedactors: {
      names: off,
      streetAddress: off,
      zipcode: off,
      phoneNumber: off,
      ipAddress: off,
      username: off,
      password: off,
      credentials: off,
      digits: off,
      url: off,
    },
  });
  const plans = {
    pii: only({ pii_detection: { enabled: true } }),
    api_key: only({ api_key_detection: { enabled: true } }),
    secrets: only({ secrets_filter: { enabled: true } }),
    patterns: only({ patterns: WORST_PATTERNS }),
  };
  const v8 = {
    pii: V8_BUILTINS.slice(0, 3),
    api_key: V8_BUILTINS.slice(3),
    secrets: [new RegExp(WORST_SECRET.replace(/[.*+?^${}()|[\]\\-]/g, '\\$&'), 'g')],
    patterns: WORST_PATTERNS.map(
      (p) => new RegExp(p.pattern.replace('(?i)', ''), p.pattern.startsWith('(?i)') ? 'gi' : 'g'),
    ),
  };
  // Ours on 8 MB; the baseline and the peer once on 16 KB of the same case, compared by MB/s: both
  // are quadratic on some of these bodies (card-like dash groups: 0.4 s at 16 KB, 7 s at 64 KB, so
  // about half an hour at 1 MB).
  const size = 8 * 1024 * 1024;
  const small = 16 * 1024;
  const once = { budgetMs: 1, minRuns: 1, warmup: 0 };
  const rows: string[][] = [];
  for (const c of WORST_CASES) {
    const body = worstBody(c, size);
    const part = worstBody(c, small);
    const ours = await measure(() => scanBody(plans[c.inspector], { body, phase: c.phase, secrets: [WORST_SECRET] }), {
      budgetMs: quick ? 300 : 1500,
      minRuns: 3,
      warmup: 1,
    });
    const oursMbs = mbPerSec(body.length, ours.p50);
    const contenders: [string, number, { p50: number; p99: number; n: number }][] = [
      [`ours: ${c.inspector}`, body.length, ours],
    ];
    contenders.push([
      'V8 RegExp: same detection (16 KB)',
      part.length,
      await measure(() => v8Scan(v8[c.inspector], part), once),
    ]);
    if (c.inspector === 'pii')
      contenders.push([
        'peer: redact-pii (email, card, ssn; 16 KB)',
        part.length,
        await measure(() => redactor.redact(part.toString('utf8')), once),
      ]);
    for (const [name, bytes, m] of contenders) {
      const mbs = mbPerSec(bytes, m.p50);
      rows.push([
        c.name,
        name,
        mbs.toFixed(0),
        formatMs(m.p50),
        formatMs(m.p99),
        String(m.n),
        (oursMbs / mbs).toFixed(2) + '×',
      ]);
    }
    process.stderr.write(`worst case done: ${c.name}\n`);
  }

  // End to end through the engine: two workers (split from 4 MB), the deadline lifted to see the time.
  const engine = new InspectionEngine({ threads: 2, timeoutMs: 60_000 });
  const policy = policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true, severity: 'block' },
        pii_detection: { enabled: true, severity: 'warn' },
        api_key_detection: { enabled: true, severity: 'block' },
        patterns: WORST_PATTERNS,
      },
    }),
  );
  const padding = Buffer.from(
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      messages: [
        {
          role: 'user',
          content:
            '4111 1111 1111 111 '.repeat(Math.ceil((32 * 1024 * 1024) / 19) - 8) +
            ` password ${WORST_SECRET} key AKIAIOSFODNN7EXAMPLE`,
        },
      ],
    }),
  );
  const e2e: string[][] = [];
  for (const [name, body] of [
    ['every worst case in one body', combinedWorstBody(32 * 1024 * 1024 - 4096)],
    ['the padding attack (card near misses, then a secret and a key)', padding],
  ] as const) {
    let last = { decision: '', failures: 0, findings: 0 };
    const m = await measure(
      async () => {
        const out = await engine.inspect({ body, phase: 'request', policy, secrets: [WORST_SECRET] });
        last = { decision: out.decision, failures: out.failures.length, findings: out.findings.length };
      },
      { budgetMs: quick ? 1000 : 5000, minRuns: 3, warmup: 1 },
    );
    e2e.push([
      name,
      sizeLabel(body.length),
      formatMs(m.p50),
      formatMs(m.p99),
      String(m.n),
      (m.p50 / 2000).toFixed(2) + '×',
      `${last.decision}, ${last.findings} findings, ${last.failures} failures`,
    ]);
  }
  await engine.close();

  return [
    `## pipeline, worst cases — ${conditions('8 MB per case (bench/worst-case.ts), each inspector alone, inline; V8 RegExp and the peer run once on 16 KB of the case; ratio = time per MB / ours (lower is faster)', UNPINNED)}`,
    '',
    table(['worst case', 'contender', 'MB/s (p50)', 'p50', 'p99', 'runs', 'time per MB vs ours'], rows),
    '',
    table(
      [
        '32 MB body through the engine (2 workers, full set + 3 patterns)',
        'body',
        'p50',
        'p99',
        'runs',
        'p50 / default 2 s deadline',
        'outcome',
      ],
      e2e,
    ),
    '',
  ].join('\n');
}

/**
 * CPU time per run of `fn` (user + system of this process), in batches of about 20 ms for `budgetMs`
 * of wall time: the best batch and the median one. On a machine other jobs share, a wall clock counts
 * their time too; the process's own CPU time counts far less of it.
 */
function cpuTime(fn: () => unknown, budgetMs: number): { best: number; median: number; runs: number } {
  for (let i = 0; i < 3; i++) fn();
  const t0 = process.cpuUsage();
  fn();
  const first = process.cpuUsage(t0);
  const once = Math.max(0.001, (first.user + first.system) / 1000);
  const perBatch = Math.max(1, Math.round(20 / once));
  const batches: number[] = [];
  const until = performance.now() + budgetMs;
  let runs = 0;
  while (batches.length < 5 || (performance.now() < until && batches.length < 1000)) {
    const c = process.cpuUsage();
    for (let i = 0; i < perBatch; i++) fn();
    const u = process.cpuUsage(c);
    batches.push((u.user + u.system) / 1000 / perBatch);
    runs += perBatch;
  }
  batches.sort((x, y) => x - y);
  return { best: batches[0], median: batches[batches.length >> 1], runs };
}

/**
 * The single-core scan alone (issue 18, "Faster scanning"): the full set inline on one core, each
 * inspector alone, and the two passes the full set cannot go below on these bodies, which carry JSON
 * escapes: building the decoded view, and one RE2.Set pass (the custom patterns and the built-in
 * prefilters) over it.
 */
async function scanOnly(quick: boolean): Promise<string> {
  const sizes = [64 * 1024, 1024 * 1024, 32 * 1024 * 1024];
  const budget = quick ? 300 : 1500;
  const patternPlan = fullPlan.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan;
  const rows: string[][] = [];
  for (const size of sizes) {
    const body = llmRequestBody(size);
    const decoded = deepScanView(body);
    const b = size >= 32 * 1024 * 1024 ? Math.max(budget, 3000) : budget;
    const contenders: [string, () => unknown][] = [
      ['ours: full set, inline', () => scanBody(fullPlan, { body, phase: 'request', secrets: BENCH_SECRETS })],
      ['pass: decoded view (JSON escapes decoded)', () => deepScanView(body)],
      ['pass: one RE2.Set over the decoded view', () => patternPlan.set!.match(decoded)],
      [
        "pass: the 10 patterns' literals located (not used: three are folded, the set pass stays)",
        () => patternPlan.patterns.map((p) => locate(decoded, p.anchor!)),
      ],
      ...Object.entries(PLANS).map(([name, plan]): [string, () => unknown] => [
        `ours: ${name}`,
        () => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }),
      ]),
    ];
    let ours = 0;
    for (const [name, fn] of contenders) {
      const c = cpuTime(fn, b);
      if (ours === 0) ours = c.median;
      rows.push([
        sizeLabel(size),
        name,
        mbPerSec(body.length, c.best).toFixed(0),
        mbPerSec(body.length, c.median).toFixed(0),
        formatMs(c.best),
        formatMs(c.median),
        String(c.runs),
        (c.median / ours).toFixed(2) + '×',
      ]);
    }
  }
  return [
    `## pipeline, single-core scan — ${conditions(`${BYTE_LOOPS}; bodies: generated LLM-like JSON (bench/corpus.ts), request phase, inline; CPU time of this process per run (best and median batch), so that other work on a shared machine weighs less than on a wall clock; ratio = median / ours full-set median`, UNPINNED)}`,
    '',
    table(
      ['body', 'contender', 'CPU MB/s (best)', 'CPU MB/s (median)', 'CPU best', 'CPU median', 'runs', 'time vs ours'],
      rows,
    ),
    '',
  ].join('\n');
}

/**
 * Before and after in one process (--against DIR): each contender of the baseline and of this
 * checkout run in turn, one run each, the p50 of each side kept; the same bodies, the same policy,
 * the same load.
 */
async function againstBaseline(dir: string, quick: boolean): Promise<string> {
  const load = (path: string) => import(pathToFileURL(`${dir}/pipeline/${path}`).href);
  const base = {
    compilePlan: (await load('plan.ts')).compilePlan as typeof compilePlan,
    scanBody: (await load('scan.ts')).scanBody as typeof scanBody,
    Engine: (await load('engine.ts')).InspectionEngine as typeof InspectionEngine,
  };
  const patterns = policyFromDocument(validatePolicyDocument({ content_inspection: { patterns: BENCH_PATTERNS } }));
  // The seven of the ten that are case-sensitive: their literals are cheap to find (Buffer.indexOf).
  const cased = policyFromDocument(
    validatePolicyDocument({
      content_inspection: { patterns: BENCH_PATTERNS.filter((p) => !p.pattern.startsWith('(?i)')) },
    }),
  );
  const sides = {
    baseline: {
      full: base.compilePlan(full),
      patterns: base.compilePlan(patterns),
      cased: base.compilePlan(cased),
      engine: new base.Engine({ threads: 2, inlineThresholdBytes: 0, timeoutMs: 60_000 }),
    },
    ours: {
      full: compilePlan(full),
      patterns: compilePlan(patterns),
      cased: compilePlan(cased),
      engine: new InspectionEngine({ threads: 2, inlineThresholdBytes: 0, timeoutMs: 60_000 }),
    },
  };
  const scanOf = { baseline: base.scanBody, ours: scanBody };
  const rows: string[][] = [];
  const bodies: [string, Buffer][] = [
    ['64 KB', llmRequestBody(64 * 1024)],
    ['1 MB', llmRequestBody(1024 * 1024)],
    ['1 MB, pattern hits', withPatternHits(llmRequestBody(1024 * 1024))],
    ['64 KB, one "…"', withOneNormalized(llmRequestBody(64 * 1024))],
    ['1 MB, one "…"', withOneNormalized(llmRequestBody(1024 * 1024))],
    ['1 MB, a "…" every 16 KB', withNormalizedEvery(llmRequestBody(1024 * 1024), 16 * 1024)],
    ['32 MB', llmRequestBody(32 * 1024 * 1024)],
  ];
  for (const [label, body] of bodies) {
    const read = asRead(body);
    const large = body.length >= 32 * 1024 * 1024;
    const budget = (quick ? 600 : 3000) * (large ? 3 : 1);
    const contenders: [string, (side: 'baseline' | 'ours') => () => unknown][] = [
      [
        'full set, inline',
        (side) => () => scanOf[side](sides[side].full, { body, phase: 'request', secrets: BENCH_SECRETS }),
      ],
      [
        'patterns (10 RE2), inline',
        (side) => () => scanOf[side](sides[side].patterns, { body, phase: 'request', secrets: BENCH_SECRETS }),
      ],
      [
        'patterns (the 7 case-sensitive), inline',
        (side) => () => scanOf[side](sides[side].cased, { body, phase: 'request', secrets: BENCH_SECRETS }),
      ],
      [
        'full set, engine (2 workers; split from 4 MB)',
        (side) => () =>
          sides[side].engine.inspect({ body: read, phase: 'request', policy: full, secrets: BENCH_SECRETS }),
      ],
    ];
    for (const [name, fnOf] of contenders) {
      // One run of each side in turn (A B B A …), so that a change of load weighs on both alike.
      const runs = { baseline: [] as number[], ours: [] as number[] };
      const fns = { baseline: fnOf('baseline'), ours: fnOf('ours') };
      for (const side of ['baseline', 'ours'] as const) for (let i = 0; i < 2; i++) await fns[side]();
      const until = performance.now() + budget;
      for (let k = 0; runs.ours.length < 5 || performance.now() < until; k++)
        for (const side of k % 2 === 0 ? (['baseline', 'ours'] as const) : (['ours', 'baseline'] as const)) {
          const t0 = performance.now();
          await fns[side]();
          runs[side].push(performance.now() - t0);
        }
      const median = (v: number[]) => [...v].sort((x, y) => x - y)[v.length >> 1];
      const b = median(runs.baseline);
      const o = median(runs.ours);
      rows.push([
        label,
        name,
        formatMs(b),
        formatMs(o),
        mbPerSec(body.length, b).toFixed(0),
        mbPerSec(body.length, o).toFixed(0),
        String(runs.ours.length),
        (o / b).toFixed(2) + '×',
      ]);
    }
  }
  await sides.baseline.engine.close();
  await sides.ours.engine.close();
  return [
    `## pipeline, against a baseline — ${conditions(`${BYTE_LOOPS}; bodies: generated LLM-like JSON (bench/corpus.ts), request phase; baseline: ${dir}; one run of each side in turn (A B B A …), p50 of each side's runs (wall clock)`, UNPINNED)}`,
    '',
    table(
      ['body', 'contender', 'baseline p50', 'ours p50', 'baseline MB/s', 'ours MB/s', 'runs', 'ours / baseline'],
      rows,
    ),
    '',
  ].join('\n');
}

/** A body where the custom patterns hit: an internal host, an incident id and a private IP about every 64 KB. */
function withPatternHits(body: Buffer): Buffer {
  let next = 0;
  return Buffer.from(
    body.toString('utf8').replace(/ the /g, (m, offset: number) => {
      if (offset < next) return m;
      next = offset + 64 * 1024;
      return ' build-7.corp.example.com INC-204817 10.1.22.3 ';
    }),
  );
}
