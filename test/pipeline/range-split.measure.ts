// Not a test: the critical path of a large body shared out across two workers, in CPU time of this one
// thread (so that other jobs on a loaded host weigh less than on a wall clock): each byte range's scan
// (worker.ts, as a pool worker runs it) against the split by inspector (patterns | the rest) and the
// whole body inline. Used for docs/decisions.md ("Unbounded patterns split by range").
// Run: node test/pipeline/range-split.measure.ts [--mb 32] [--runs 7]
import { parseArgs } from 'node:util';
import { BENCH_SECRETS, FULL_SET_DOCUMENT, llmRequestBody } from '../../bench/corpus.ts';
import { planRanges, secretsReach } from '../../pipeline/byte-ranges.ts';
import type { PatternPlan } from '../../pipeline/inspectors/patterns.ts';
import { carriesJsonEscapes } from '../../pipeline/json-view.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { pooledPolicy } from '../../pipeline/pooled-policy.ts';
import { scanBody } from '../../pipeline/scan.ts';
import { inspectReporting } from '../../pipeline/worker.ts';

const { values } = parseArgs({
  options: { mb: { type: 'string', default: '32' }, runs: { type: 'string', default: '7' } },
});
const policy = policyFromDocument(validatePolicyDocument(FULL_SET_DOCUMENT));
const plan = compilePlan(policy);
const patterns = plan.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan;
const body = llmRequestBody(Number(values.mb) * 1024 * 1024);
const secrets = [...BENCH_SECRETS];
const reach = patterns.rangeReach === null ? null : Math.max(secretsReach(secrets)!, patterns.rangeReach);
const ranges = reach === null ? null : planRanges(body, 2, reach);
const context = { jsonEscapes: carriesJsonEscapes(body) };
const task = { body, policy: pooledPolicy(policy), phase: 'request' as const, secrets };

const cpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
const contenders: [string, () => unknown][] = [
  ['whole body, inline', () => scanBody(plan, { body, phase: 'request', secrets })],
  ['by inspector: patterns', () => inspectReporting({ ...task, part: 'patterns' })],
  ['by inspector: the rest', () => inspectReporting({ ...task, part: 'others' })],
  ...(ranges ?? []).map(
    (range, i) =>
      [`range ${i + 1} of ${ranges!.length}`, () => inspectReporting({ ...task, part: 'all', range, context })] as [
        string,
        () => unknown,
      ],
  ),
];
const times = new Map<string, number[]>(contenders.map(([name]) => [name, []]));
for (let r = 0; r <= Number(values.runs); r++)
  for (const [name, fn] of contenders) {
    const t0 = cpu();
    fn();
    if (r > 0) times.get(name)!.push(cpu() - t0);
  }
const median = (v: number[]) => [...v].sort((a, b) => a - b)[v.length >> 1];
console.log(
  `${values.mb} MB body, ${ranges ? `ranges ${JSON.stringify(ranges)}` : 'not split by range'}; load ${(
    await import('node:os')
  )
    .loadavg()
    .map((l) => l.toFixed(1))
    .join(' ')}`,
);
for (const [name, v] of times)
  console.log(`${name.padEnd(28)} median ${median(v).toFixed(1)} ms  min ${Math.min(...v).toFixed(1)} ms`);
const m = (name: string) => median(times.get(name)!);
console.log(
  `critical path by inspector: ${Math.max(m('by inspector: patterns'), m('by inspector: the rest')).toFixed(1)} ms`,
);
if (ranges)
  console.log(
    `critical path by range: ${Math.max(...ranges.map((_, i) => m(`range ${i + 1} of ${ranges.length}`))).toFixed(1)} ms`,
  );
