import type { MessagePort } from 'node:worker_threads';
import { mergeResults, type ByteRange, type ViewContext } from './byte-ranges.ts';
import { PlanCache } from './plan.ts';
import { scanBody, type ScanPart, type ScanResult } from './scan.ts';
import type { Phase } from './finding.ts';
import type { PooledPolicy } from './pooled-policy.ts';

// Piscina worker entry: the built-in scan over a body the main thread shares with us (a view over a
// SharedArrayBuffer: not copied on the way in). Each worker compiles a policy once per version, from
// the bytes the task shares with it (pooled-policy.ts).
// Each inspector's result is posted on the task's port as soon as it finishes: when the deadline
// terminates this thread, the engine still has what finished (engine.ts).

export interface WorkerTask {
  body: Uint8Array;
  policy: PooledPolicy;
  phase: Phase;
  secrets: readonly string[];
  part: ScanPart;
  modelsAnywhere?: { contentType: string | null };
  skipModel?: boolean;
  /**
   * Scan only these bytes of the body (byte-ranges.ts), read as the whole body's `context` says; the
   * body itself stays the one shared buffer. Model restriction, which reads the top level, never runs
   * on a range: with `modelWhole` it runs first over the whole body.
   */
  range?: ByteRange;
  context?: ViewContext;
  modelWhole?: boolean;
  /** Where each inspector's result goes as it finishes (an `InspectorReport` per inspector). */
  port?: MessagePort;
  /** Set to 1 (and notified) when a worker starts the task: its deadline runs from then (engine.ts). */
  started?: Int32Array;
}

export interface InspectorReport {
  inspector: string;
  result: ScanResult;
}

const plans = new PlanCache({ capacity: 64 });

/** Tells the engine a worker took the task: the deadline starts now. */
export function markStarted(task: WorkerTask): void {
  if (!task.started) return;
  Atomics.store(task.started, 0, 1);
  Atomics.notify(task.started, 0);
}

export default function inspect(task: WorkerTask): ScanResult {
  markStarted(task);
  const port = task.port;
  return inspectReporting(
    task,
    port ? (inspector, result) => port.postMessage({ inspector, result } satisfies InspectorReport) : undefined,
  );
}

/** The scan, with each inspector's result handed to `onInspector` as it finishes (tests wrap it). */
export function inspectReporting(
  task: WorkerTask,
  onInspector?: (inspector: string, result: ScanResult) => void,
): ScanResult {
  const body = Buffer.from(task.body.buffer, task.body.byteOffset, task.body.byteLength);
  try {
    const plan = plans.getPooled(task.policy);
    if (task.range) {
      const { start, end } = task.range;
      const common = { phase: task.phase, secrets: task.secrets, modelsAnywhere: task.modelsAnywhere, onInspector };
      const model = task.modelWhole ? scanBody(plan, { ...common, body, modelOnly: true }) : null;
      const range = scanBody(plan, {
        ...common,
        body: body.subarray(start, end),
        part: task.part,
        skipModel: true,
        context: task.context,
        within: { body, start, end },
      });
      return model ? mergeResults([model, range]) : range;
    }
    return scanBody(plan, {
      body,
      phase: task.phase,
      secrets: task.secrets,
      part: task.part,
      modelsAnywhere: task.modelsAnywhere,
      skipModel: task.skipModel,
      onInspector,
    });
  } finally {
    task.port?.close();
  }
}
