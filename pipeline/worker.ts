import { PlanCache } from './plan.ts';
import { scanBody, type ScanPart, type ScanResult } from './scan.ts';
import type { Phase } from './finding.ts';
import type { ResolvedPolicy } from './policy/types.ts';

// Piscina worker entry: the built-in scan over a body the main thread shares with us (a view over a
// SharedArrayBuffer: not copied on the way in). Each worker compiles a policy once per version.

export interface WorkerTask {
  body: Uint8Array;
  policy: ResolvedPolicy;
  phase: Phase;
  secrets: readonly string[];
  part: ScanPart;
  modelsAnywhere?: { contentType: string | null };
  skipModel?: boolean;
}

const plans = new PlanCache({ capacity: 64 });

export default function inspect(task: WorkerTask): ScanResult {
  const body = Buffer.from(task.body.buffer, task.body.byteOffset, task.body.byteLength);
  return scanBody(plans.get(task.policy), { body, phase: task.phase, secrets: task.secrets, part: task.part, modelsAnywhere: task.modelsAnywhere, skipModel: task.skipModel });
}
