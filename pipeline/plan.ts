import type { CompileWarning, Inspector } from './inspector.ts';
import type { PrefilterId } from './inspectors/patterns.ts';
import { INSPECTORS } from './inspectors/registry.ts';
import type { ResolvedPolicy } from './policy/types.ts';

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
}

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
  return { version: policy.version, inspectors, warnings };
}

/** Whether the plan runs the inspector with this id. */
export function plans(plan: ScanPlan, id: string): boolean {
  return plan.inspectors.some((p) => p.inspector.id === id);
}

/** Plans by policy version, least recently used dropped past `capacity`. */
export class PlanCache {
  #plans = new Map<string, ScanPlan>();
  #capacity: number;
  #onCompile: ((plan: ScanPlan) => void) | undefined;

  constructor(options: { capacity?: number; onCompile?: (plan: ScanPlan) => void } = {}) {
    this.#capacity = options.capacity ?? 256;
    this.#onCompile = options.onCompile;
  }

  get(policy: ResolvedPolicy): ScanPlan {
    let plan = this.#plans.get(policy.version);
    if (plan) {
      this.#plans.delete(policy.version);
      this.#plans.set(policy.version, plan);
      return plan;
    }
    plan = compilePlan(policy);
    this.#plans.set(policy.version, plan);
    if (this.#plans.size > this.#capacity) this.#plans.delete(this.#plans.keys().next().value!);
    this.#onCompile?.(plan);
    return plan;
  }
}
