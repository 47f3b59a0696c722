import type { CompileWarning, Inspector } from './inspector.ts';
import type { Phase } from './finding.ts';
import { id as PATTERNS, type PatternPlan, type PrefilterId } from './inspectors/patterns.ts';
import { INSPECTORS, MODEL_RESTRICTION, SPLIT_OFF } from './inspectors/registry.ts';
import type { ResolvedPolicy } from './policy/types.ts';
import { readPooledPolicy, type PooledPolicy } from './pooled-policy.ts';

// A resolved policy compiled into what the scanners run: each inspector of the registry compiled once
// (model globs checked, regexes compiled into an RE2.Set). Compiling costs far more than a scan, so
// plans are cached by policy version, on the main thread and in every worker.

export interface PlannedInspector {
  inspector: Inspector<unknown>;
  /** What it compiled to under this policy (never null: an inspector that is off is not planned). */
  compiled: unknown;
}

export interface ScanPlan {
  version: string;
  /** The inspectors this policy turns on, in the registry's order. */
  inspectors: readonly PlannedInspector[];
  /** What compiling found worth a log line, once per policy version. */
  warnings: readonly CompileWarning[];
  /** The inspectors each kind of scan runs, worked out on first use (runFor). */
  runs: (ScanRun | undefined)[];
}

/** Which inspectors a scan runs: all of them, or one half of a body split across two workers. */
export type ScanPart = 'all' | 'patterns' | 'others';

export function compilePlan(policy: ResolvedPolicy, registry: readonly Inspector<unknown>[] = INSPECTORS): ScanPlan {
  const inspectors: PlannedInspector[] = [];
  const warnings: CompileWarning[] = [];
  // With custom patterns, one RE2.Set pass also prefilters the built-in detectors (patterns.ts).
  const prefilters: PrefilterId[] = [];
  for (const inspector of registry) {
    const compiled = inspector.compile(policy, { prefilters });
    if (compiled === null) continue;
    inspectors.push({ inspector, compiled });
    if (inspector.prefilters) prefilters.push(...inspector.prefilters(compiled));
    if (inspector.warnings) warnings.push(...inspector.warnings(compiled));
  }
  return { version: policy.version, inspectors, warnings, runs: [] };
}

/** Whether the plan runs the inspector with this id. */
export function hasInspector(plan: ScanPlan, id: string): boolean {
  return plan.inspectors.some((p) => p.inspector.id === id);
}

/**
 * The inspectors one kind of scan runs, and what the input must know of them: whether one reads the
 * decoded view (the normalized view is then built on it), the custom patterns' plan when they run
 * (their set pass prefilters the detectors), whether a stream's joined text is built first (the
 * spec's flow reads the stream before any inspector), and whether the normalized step runs. Worked
 * out once per plan and kind of scan, so a scan itself only walks its list.
 */
export interface ScanRun {
  inspectors: PlannedInspector[];
  normalizeDecoded: boolean;
  normalized: boolean;
  patterns: PatternPlan | null;
  joined: boolean;
}

const PARTS: readonly ScanPart[] = ['all', 'patterns', 'others'];

/** The run of one kind of scan: its phase, whether the agent has secrets, its part and skips. */
export function runFor(
  plan: ScanPlan,
  phase: Phase,
  secretCount: number,
  part: ScanPart,
  skipModel: boolean,
  modelOnly: boolean,
): ScanRun {
  const key =
    (phase === 'request' ? 1 : 0) |
    (secretCount > 0 ? 2 : 0) |
    (skipModel ? 4 : 0) |
    (modelOnly ? 8 : 0) |
    (PARTS.indexOf(part) << 4);
  let run = plan.runs[key];
  if (run === undefined) {
    run = { inspectors: [], normalizeDecoded: false, normalized: false, patterns: null, joined: false };
    for (const p of plan.inspectors) {
      const { inspector } = p;
      if (!inspector.phases.includes(phase)) continue;
      if (inspector.readsJoined && phase === 'response') run.joined = true;
      if (part !== 'all' && (part === 'patterns') !== (inspector.id === SPLIT_OFF)) continue;
      if (inspector.id === MODEL_RESTRICTION ? skipModel : modelOnly) continue;
      if (inspector.needsSecrets && secretCount === 0) continue;
      run.inspectors.push(p);
      if (inspector.readsDecoded) run.normalizeDecoded = true;
      if (inspector.scanNormalized) run.normalized = true;
      if (inspector.id === PATTERNS) run.patterns = p.compiled as PatternPlan;
    }
    plan.runs[key] = run;
  }
  return run;
}

/** Plans by policy version, least recently used dropped past `capacity`. */
export class PlanCache {
  #plans = new Map<string, ScanPlan>();
  #capacity: number;
  #onCompile: ((plan: ScanPlan) => void) | undefined;
  #last: ScanPlan | null = null;

  constructor(options: { capacity?: number; onCompile?: (plan: ScanPlan) => void } = {}) {
    this.#capacity = options.capacity ?? 256;
    this.#onCompile = options.onCompile;
  }

  get(policy: ResolvedPolicy): ScanPlan {
    return this.#get(policy.version, () => policy);
  }

  /** The plan of the policy a pool task carries: its bytes read only to compile it (pooled-policy.ts). */
  getPooled(task: PooledPolicy): ScanPlan {
    return this.#get(task.version, () => readPooledPolicy(task));
  }

  #get(version: string, policyFor: () => ResolvedPolicy): ScanPlan {
    // The plan asked for last is already the most recent (only #get reorders or evicts, and an
    // eviction drops the least recent): nothing to look up or move (most calls, one policy).
    const last = this.#last;
    if (last !== null && last.version === version) return last;
    let plan = this.#plans.get(version);
    if (plan) {
      this.#last = plan;
      this.#plans.delete(version);
      this.#plans.set(version, plan);
      return plan;
    }
    plan = compilePlan(policyFor());
    this.#plans.set(version, plan);
    if (this.#plans.size > this.#capacity) this.#plans.delete(this.#plans.keys().next().value!);
    // (With no room at all, the plan just made was dropped: it is not the last one kept.)
    this.#last = this.#plans.get(version) === plan ? plan : null;
    this.#onCompile?.(plan);
    return plan;
  }
}
