import type { Finding, Phase } from './finding.ts';
import { failureReason, InspectionInput, NORMALIZED_VIEW, type InspectorFailure } from './inspection-input.ts';
import type { ScanShape } from './inspector.ts';
import { id as PATTERNS, type PatternPlan } from './inspectors/patterns.ts';
import { MODEL_RESTRICTION, SPLIT_OFF } from './inspectors/registry.ts';
import type { PlannedInspector, ScanPlan } from './plan.ts';

// The synchronous half of the pipeline: every built-in inspector of the plan over one body, the same
// code inline on the main thread and inside a pool worker.
//
//   body ─▶ InspectionInput (views built lazily, once) ─▶ each planned inspector, registry order:
//             model restriction │ secrets │ api_key │ pii │ patterns      scan(input)      ─▶ report each
//           ─▶ then every one of them again over the normalized views   scanNormalized() ─▶ report
//                                                                        `normalized_view`
//
// Which bytes each one reads is its own business (inspectors/*.ts, the `inspector` export); the input
// builds a view at most once per body and only when something reads it (inspection-input.ts). The
// normalized view is a step of its own, last: what the literal views found is reported before it
// starts, so a deadline that catches the normalized view names it (`normalized_view`) and keeps the
// rest. An inspector that throws is reported as a failure, never as a clean pass (STYLE.md rule 13).

export { NORMALIZED_VIEW, SSE_TEXT, type InspectorFailure } from './inspection-input.ts';

/** Which inspectors a scan runs: all of them, or one half of a body split across two workers. */
export type ScanPart = 'all' | 'patterns' | 'others';

export interface ScanRequest {
  body: Buffer;
  phase: Phase;
  secrets: readonly string[];
  part?: ScanPart;
  /**
   * Model restriction checks every model named anywhere in the body, read by its content type
   * (named-models.ts), instead of the top-level `model`: the proxy's pass-through routes.
   */
  modelsAnywhere?: { contentType: string | null };
  /** Model restriction already ran (the engine checks a pooled inference body's model first). */
  skipModel?: boolean;
  /** Run model restriction only (the engine's check of a pooled inference body's model). */
  modelOnly?: boolean;
  /**
   * Called as each inspector of `builtinInspectors` finishes, with what it found: a pool worker
   * reports these as it goes, so a deadline keeps what finished (engine.ts). Not set inline.
   */
  onInspector?: (inspector: string, result: ScanResult) => void;
}

export interface ScanResult {
  findings: Finding[];
  failures: InspectorFailure[];
}

interface Selection {
  part: ScanPart;
  skipModel: boolean;
  modelOnly: boolean;
}

/** Whether a planned inspector runs in a scan of this shape and part. */
function runs(p: PlannedInspector, shape: ScanShape, selection: Selection): boolean {
  const id = p.inspector.id;
  if (selection.part !== 'all' && (selection.part === 'patterns') !== (id === SPLIT_OFF)) return false;
  if (id === MODEL_RESTRICTION ? selection.skipModel : selection.modelOnly) return false;
  return p.inspector.phases.includes(shape.phase) && (p.inspector.hasWork?.(shape) ?? true);
}

const ALL: Selection = { part: 'all', skipModel: false, modelOnly: false };

/** Whether any built-in inspector has work in this phase (sidecars are handled by the engine). */
export function hasBuiltinWork(plan: ScanPlan, phase: Phase, secretCount: number, skipModel = false): boolean {
  const shape = { phase, secretCount };
  const selection = skipModel ? { ...ALL, skipModel } : ALL;
  return plan.inspectors.some((p) => runs(p, shape, selection));
}

/**
 * The built-in inspectors a scan runs, in the order it runs them (the registry's), then the normalized
 * view's step when any of them reads it. Each named here reports once through `onInspector`, even
 * when a prefilter finds it has nothing to look at.
 */
export function builtinInspectors(
  plan: ScanPlan,
  phase: Phase,
  secretCount: number,
  part: ScanPart = 'all',
  skipModel = false,
): string[] {
  const shape = { phase, secretCount };
  const selection = { part, skipModel, modelOnly: false };
  const out: string[] = [];
  let normalized = false;
  for (const p of plan.inspectors) {
    if (!runs(p, shape, selection)) continue;
    out.push(p.inspector.id);
    if (p.inspector.scanNormalized) normalized = true;
  }
  if (normalized) out.push(NORMALIZED_VIEW);
  return out;
}

function unreported(_inspector: string): void {}

function findingKey(f: Finding): string {
  return `${f.inspector_type}\u0000${f.description}\u0000${f.match}\u0000${f.severity}`;
}

export function scanBody(plan: ScanPlan, request: ScanRequest): ScanResult {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const failures: InspectorFailure[] = [];
  const { body, phase } = request;
  const shape = { phase, secretCount: request.secrets.length };
  const selection: Selection = {
    part: request.part ?? 'all',
    skipModel: request.skipModel ?? false,
    modelOnly: request.modelOnly ?? false,
  };
  const onInspector = request.onInspector;
  let reportedFindings = 0;
  let reportedFailures = 0;
  // (Inline, with no one to report to, no closure is made for it.)
  const done = onInspector ? (inspector: string) => {
    const result = { findings: findings.slice(reportedFindings), failures: failures.slice(reportedFailures) };
    onInspector(inspector, result);
    reportedFindings = findings.length;
    reportedFailures = failures.length;
  } : unreported;
  const keep = (found: readonly Finding[]) => {
    for (const f of found) {
      const key = findingKey(f);
      if (!seen.has(key)) {
        seen.add(key);
        findings.push(f);
      }
    }
  };

  // Which planned inspectors run, and what the input must know of them: whether one reads the decoded
  // view (the normalized view is then built on it), whether the custom patterns run (their set pass
  // prefilters the detectors), whether a stream's joined text is wanted (built first, as the spec's
  // flow reads the stream before any inspector).
  const running: PlannedInspector[] = [];
  let normalizeDecoded = false;
  let normalized = false;
  let patterns: PatternPlan | null = null;
  let joined = false;
  for (const p of plan.inspectors) {
    if (p.inspector.readsJoined && p.inspector.phases.includes(phase)) joined = true;
    if (!runs(p, shape, selection)) continue;
    running.push(p);
    if (p.inspector.readsDecoded) normalizeDecoded = true;
    if (p.inspector.scanNormalized) normalized = true;
    if (p.inspector.id === PATTERNS) patterns = p.compiled as PatternPlan;
  }
  const input = new InspectionInput({
    raw: body,
    phase,
    secrets: request.secrets,
    modelsAnywhere: request.modelsAnywhere ?? null,
    failures,
    normalizeDecoded,
    patterns,
  });
  if (joined && phase === 'response') input.joined();

  for (const p of running) {
    try {
      keep(p.inspector.scan(input, p.compiled));
    } catch (err) {
      failures.push({ inspector: p.inspector.id, reason: failureReason(err) });
    }
    done(p.inspector.id);
  }
  if (!normalized) return { findings, failures };
  // Both normalized views first, as one step: a view that fails to build is a recorded failure.
  input.normalized();
  input.normalizedJoined();
  for (const p of running) {
    if (!p.inspector.scanNormalized) continue;
    try {
      keep(p.inspector.scanNormalized(input, p.compiled));
    } catch (err) {
      failures.push({ inspector: p.inspector.id, reason: failureReason(err) });
    }
  }
  done(NORMALIZED_VIEW);
  return { findings, failures };
}
