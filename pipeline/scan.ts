import type { Finding, Phase } from './finding.ts';
import {
  failureReason,
  InspectionInput,
  NORMALIZED_VIEW,
  type InspectorFailure,
  type Within,
} from './inspection-input.ts';
import type { ViewContext } from './byte-ranges.ts';
import { runFor, type ScanPart, type ScanPlan } from './plan.ts';
import { ScratchBuffers } from './scratch-buffers.ts';
import { alignedCopy, isShared, SCAN_COPY_UP_TO_BYTES } from './shared-bytes.ts';

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
// rest. An inspector that throws is reported as a failure, never as a clean pass (docs/decisions.md,
// "Failure posture").

export type { InspectorFailure } from './inspection-input.ts';
export type { ScanPart } from './plan.ts';

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
  /**
   * The body is one byte range of a larger one (byte-ranges.ts): its views read escapes as the whole
   * body's do, not as its own first bytes would say.
   */
  context?: ViewContext;
  /** The body is bytes [start, end) of this larger one (a byte range's scan): a pattern may read on. */
  within?: Within;
  /** Model restriction already ran (the engine checks a pooled inference body's model first). */
  skipModel?: boolean;
  /** Run model restriction only (the engine's check of a pooled inference body's model). */
  modelOnly?: boolean;
  /**
   * Called as each inspector of `builtinInspectors` finishes, with what it found: a pool worker
   * reports these as it goes, so a deadline keeps what finished (engine.ts). Not set inline.
   */
  onInspector?: (inspector: string, result: ScanResult) => void;
  /** The normalized stage reads the whole view, not its windows around changes (tests compare the two). */
  wholeNormalized?: boolean;
}

export interface ScanResult {
  findings: Finding[];
  failures: InspectorFailure[];
}

/** Whether any built-in inspector has work in this phase (sidecars are handled by the engine). */
export function hasBuiltinWork(plan: ScanPlan, phase: Phase, secretCount: number, skipModel = false): boolean {
  return runFor(plan, phase, secretCount, 'all', skipModel, false).inspectors.length > 0;
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
  const run = runFor(plan, phase, secretCount, part, skipModel, false);
  const out = run.inspectors.map((p) => p.inspector.id);
  if (run.normalized) out.push(NORMALIZED_VIEW);
  return out;
}

function unreported(_inspector: string): void {}

/** What makes two findings the same one (byte-ranges.ts merges a split scan's ranges by it too). */
export function findingKey(f: Finding): string {
  return `${f.inspector_type}\u0000${f.description}\u0000${f.match}\u0000${f.severity}`;
}

/**
 * Adds the findings not already kept (the same finding from two views is one). The keys of those kept
 * are made only once a second finding comes (most small bodies find nothing, or one thing): `seen` is
 * then built from what was kept, and returned for the next call.
 */
function keep(findings: Finding[], seen: Set<string> | null, found: readonly Finding[]): Set<string> | null {
  if (found.length === 0) return seen;
  if (seen === null) {
    if (findings.length === 0 && found.length === 1) {
      findings.push(found[0]);
      return null;
    }
    seen = new Set();
    for (const f of findings) seen.add(findingKey(f));
  }
  for (const f of found) {
    const key = findingKey(f);
    if (!seen.has(key)) {
      seen.add(key);
      findings.push(f);
    }
  }
  return seen;
}

export function scanBody(plan: ScanPlan, request: ScanRequest): ScanResult {
  const findings: Finding[] = [];
  const failures: InspectorFailure[] = [];
  const part = request.part ?? 'all';
  const run = runFor(
    plan,
    request.phase,
    request.secrets.length,
    part,
    request.skipModel ?? false,
    request.modelOnly ?? false,
  );
  const onInspector = request.onInspector;
  let reportedFindings = 0;
  let reportedFailures = 0;
  // (Inline, with no one to report to, no closure is made for it.)
  const done = onInspector
    ? (inspector: string) => {
        const result = { findings: findings.slice(reportedFindings), failures: failures.slice(reportedFailures) };
        onInspector(inspector, result);
        reportedFindings = findings.length;
        reportedFailures = failures.length;
      }
    : unreported;

  // The decoded view's buffers are lent for this scan only (scratch-buffers.ts): nothing returned
  // holds a view, and they are given back however the scan ends.
  const scratch = new ScratchBuffers();
  try {
    // A body in shared memory is read from a copy of its own, up to a size (shared-bytes.ts); not for
    // the model alone, which reads the top level's few bytes in place.
    const local =
      isShared(request.body) && request.body.length <= SCAN_COPY_UP_TO_BYTES && !request.modelOnly
        ? { ...request, body: alignedCopy(request.body, (n) => scratch.take(n)) }
        : request;
    return scanWith(local, run, findings, failures, done, scratch);
  } finally {
    scratch.end();
  }
}

/** scanBody's steps over one input, `run` being what the plan runs for this request. */
function scanWith(
  request: ScanRequest,
  run: ReturnType<typeof runFor>,
  findings: Finding[],
  failures: InspectorFailure[],
  done: (inspector: string) => void,
  scratch: ScratchBuffers,
): ScanResult {
  let seen: Set<string> | null = null;
  const input = new InspectionInput({
    raw: request.body,
    phase: request.phase,
    secrets: request.secrets,
    modelsAnywhere: request.modelsAnywhere ?? null,
    failures,
    normalizeDecoded: run.normalizeDecoded,
    patterns: run.patterns,
    context: request.context ?? null,
    within: request.within ?? null,
    wholeNormalized: request.wholeNormalized ?? false,
    scratch,
  });
  if (run.joined) input.joined();

  for (const p of run.inspectors) {
    try {
      seen = keep(findings, seen, p.inspector.scan(input, p.compiled));
    } catch (err) {
      failures.push({ inspector: p.inspector.id, reason: failureReason(err) });
    }
    done(p.inspector.id);
  }
  if (!run.normalized) return { findings, failures };
  // Both normalized views first, as one step: a view that fails to build is a recorded failure.
  input.normalized();
  input.normalizedJoined();
  for (const p of run.inspectors) {
    if (!p.inspector.scanNormalized) continue;
    try {
      seen = keep(findings, seen, p.inspector.scanNormalized(input, p.compiled));
    } catch (err) {
      failures.push({ inspector: p.inspector.id, reason: failureReason(err) });
    }
  }
  done(NORMALIZED_VIEW);
  return { findings, failures };
}
