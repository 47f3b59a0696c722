import type { Finding, Phase } from './finding.ts';
import type { InspectionInput } from './inspection-input.ts';
import type { PrefilterId } from './inspectors/patterns.ts';
import type { ResolvedPolicy } from './policy/types.ts';

// The contract every built-in inspector implements (docs/decisions.md, "The inspector contract").
// The planner compiles each one once per policy version (plan.ts) and the scanner runs each, in the
// registry's order, over one InspectionInput per body (scan.ts). An inspector is pure and synchronous:
// no I/O, no state between calls beyond caches keyed by what it compiled. The sidecars are the one
// asynchronous inspector and stay outside this contract (inspectors/sidecar.ts says why).

/** What an inspector's compile may read besides the policy. */
export interface CompileContext {
  /** The prefilters the inspectors before it asked for (`prefilters` below), for the patterns' RE2.Set. */
  prefilters: readonly PrefilterId[];
}

/** Something worth a log line, found while compiling (an invalid pattern, a malformed glob). */
export interface CompileWarning {
  message: string;
  fields: Record<string, unknown>;
}

export interface Inspector<Compiled> {
  /** The finding's `inspector_type`, the failure's `inspector` and the pool's report name. */
  readonly id: string;
  /** The phases it runs in. */
  readonly phases: readonly Phase[];
  /** It reads the decoded view: the normalized view is then built on that view (scan.ts). */
  readonly readsDecoded?: boolean;
  /** It reads the joined text of a streamed response: that text is built before any inspector runs. */
  readonly readsJoined?: boolean;
  /** What it runs under this policy; null: it is off. */
  compile(policy: ResolvedPolicy, context: CompileContext): Compiled | null;
  /** It has nothing to look for unless the agent has secret values (declared, not asked: see scan.ts). */
  readonly needsSecrets?: boolean;
  /** Prefilters (patterns.ts, PREFILTERS) whose miss proves it has nothing to find. */
  prefilters?(compiled: Compiled): readonly PrefilterId[];
  warnings?(compiled: Compiled): CompileWarning[];
  /** Its findings in the views as sent and decoded. A throw is recorded as its failure, never a pass. */
  scan(input: InspectionInput, compiled: Compiled): Finding[];
  /**
   * Its findings in the normalized views (normalized-view.ts), run as one last step for every
   * inspector (`normalized_view`, scan.ts). Absent: it does not read them.
   */
  scanNormalized?(input: InspectionInput, compiled: Compiled): Finding[];
}

/**
 * An inspector with every field of the contract present, in one order: all inspectors then share one
 * object shape, and the scanner's calls through them stay cheap property loads (not megamorphic ones).
 */
export function defineInspector<Compiled>(spec: Inspector<Compiled>): Inspector<Compiled> {
  return {
    id: spec.id,
    phases: spec.phases,
    readsDecoded: spec.readsDecoded ?? false,
    readsJoined: spec.readsJoined ?? false,
    needsSecrets: spec.needsSecrets ?? false,
    compile: spec.compile,
    prefilters: spec.prefilters,
    warnings: spec.warnings,
    scan: spec.scan,
    scanNormalized: spec.scanNormalized,
  };
}
