import type { MessagePort } from 'node:worker_threads';
import type { ByteRange, ViewContext } from './byte-ranges.ts';
import { failureReason, InspectionInput, type InputOptions, NORMALIZED_VIEW } from './inspection-input.ts';
import { PlanCache, runFor, type PlannedInspector, type ScanPlan } from './plan.ts';
import type { PooledPolicy } from './pooled-policy.ts';
import { findingKey, type ScanResult } from './scan.ts';
import type { Finding } from './finding.ts';
import type { InspectorReport } from './worker.ts';

// One stretch of a streamed response (stream-inspection.ts), scanned as scan.ts scans a whole body,
// on the main thread or in a pool worker (the default export, run by the engine with this file's name):
//
//   'bytes'   a byte range of the stream as sent, read as the whole body's views (ViewContext), every
//             built-in inspector of the response phase; no joined text (the joiner builds that)
//   'joined'  joined delta text of finished blocks (sse-text.ts): only the inspectors that read the
//             joined text, over it and its normalized view, as they read it in a whole-body scan
//
// A whole-body scan of a response is the union of the two: its views as sent plus its joined text.

export type StretchKind = 'bytes' | 'joined';

export interface StretchTask {
  kind: StretchKind;
  /** 'bytes': the stream's bytes (the range is read, the rest is context); 'joined': the text. */
  body: Uint8Array;
  range?: ByteRange;
  context?: ViewContext;
  policy: PooledPolicy;
  secrets: readonly string[];
  port?: MessagePort;
  started?: Int32Array;
}

/** The input of a stretch: the joined text is given (or there is none), never built from `raw`. */
class StretchInput extends InspectionInput {
  readonly #text: Buffer | null;

  constructor(options: InputOptions, text: Buffer | null) {
    super(options);
    this.#text = text;
  }

  override joined(): Buffer | null {
    return this.#text;
  }
}

/** The inspectors a stretch of this kind runs, in the order a whole scan runs them. */
function planned(plan: ScanPlan, kind: StretchKind, secretCount: number): PlannedInspector[] {
  const run = runFor(plan, 'response', secretCount, 'all', false, false);
  return kind === 'bytes' ? run.inspectors : run.inspectors.filter((p) => p.inspector.readsJoined);
}

/** What a stretch scan reports, one name per step (engine.ts reads these when a task fails). */
export function stretchInspectors(plan: ScanPlan, kind: StretchKind, secretCount: number): string[] {
  const list = planned(plan, kind, secretCount);
  const out = list.map((p) => p.inspector.id);
  if (list.some((p) => p.inspector.scanNormalized)) out.push(NORMALIZED_VIEW);
  return out;
}

export function scanStretch(
  plan: ScanPlan,
  task: StretchTask,
  onInspector?: (inspector: string, result: ScanResult) => void,
): ScanResult {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const failures: ScanResult['failures'] = [];
  const keep = (found: readonly Finding[]) => {
    for (const f of found) {
      const key = findingKey(f);
      if (seen.has(key)) continue;
      seen.add(key);
      findings.push(f);
    }
  };
  let reportedFindings = 0;
  let reportedFailures = 0;
  const done = (inspector: string) => {
    if (!onInspector) return;
    onInspector(inspector, { findings: findings.slice(reportedFindings), failures: failures.slice(reportedFailures) });
    reportedFindings = findings.length;
    reportedFailures = failures.length;
  };
  const all = Buffer.from(task.body.buffer, task.body.byteOffset, task.body.byteLength);
  const run = runFor(plan, 'response', task.secrets.length, 'all', false, false);
  const inspectors = planned(plan, task.kind, task.secrets.length);
  const bytes = task.kind === 'bytes';
  const raw = bytes ? (task.range ? all.subarray(task.range.start, task.range.end) : all) : Buffer.alloc(0);
  const input = new StretchInput(
    {
      raw,
      phase: 'response',
      secrets: task.secrets,
      modelsAnywhere: null,
      failures,
      normalizeDecoded: run.normalizeDecoded,
      // The patterns' set pass prefilters nothing in the response phase; over an empty raw it is empty.
      patterns: run.patterns,
      context: bytes ? (task.context ?? null) : null,
    },
    bytes ? null : all,
  );
  for (const p of inspectors) {
    try {
      keep(p.inspector.scan(input, p.compiled));
    } catch (err) {
      failures.push({ inspector: p.inspector.id, reason: failureReason(err) });
    }
    done(p.inspector.id);
  }
  if (!inspectors.some((p) => p.inspector.scanNormalized)) return { findings, failures };
  input.normalized();
  input.normalizedJoined();
  for (const p of inspectors) {
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

const plans = new PlanCache({ capacity: 64 });

/** The pool's entry for a stretch (engine.ts runs it by this file's name). */
export default function inspectStretch(task: StretchTask): ScanResult {
  if (task.started) {
    Atomics.store(task.started, 0, 1);
    Atomics.notify(task.started, 0);
  }
  const port = task.port;
  try {
    return scanStretch(
      plans.getPooled(task.policy),
      task,
      port ? (inspector, result) => port.postMessage({ inspector, result } satisfies InspectorReport) : undefined,
    );
  } finally {
    port?.close();
  }
}
