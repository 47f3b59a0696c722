import { bodyLocation, type Finding, type Phase } from './finding.ts';
import { scanView } from './json-view.ts';
import * as apiKey from './inspectors/api-key.ts';
import * as model from './inspectors/model-restriction.ts';
import * as patterns from './inspectors/patterns.ts';
import * as pii from './inspectors/pii.ts';
import * as secrets from './inspectors/secrets.ts';
import type { ScanPlan } from './plan.ts';

// The synchronous half of the pipeline: every built-in inspector over one body, the same code inline on
// the main thread and inside a pool worker. Which inspectors run in which phase follows the spec's flow:
//   request:  model restriction (raw body) │ secrets │ pii │ api_key │ patterns   (over the decoded view)
//   response: secrets │ patterns
// An inspector that throws is reported as a failure, never as a clean pass (STYLE.md rule 10).

export interface ScanRequest {
  body: Buffer;
  phase: Phase;
  secrets: readonly string[];
}

export interface InspectorFailure {
  inspector: string;
  reason: string;
}

export interface ScanResult {
  findings: Finding[];
  failures: InspectorFailure[];
}

/** Whether any built-in inspector has work in this phase (sidecars are handled by the engine). */
export function hasBuiltinWork(plan: ScanPlan, phase: Phase, secretCount: number): boolean {
  if (phase === 'request' && (plan.model || plan.pii || plan.apiKey)) return true;
  return plan.patterns !== null || (plan.secrets !== null && secretCount > 0);
}

export function scanBody(plan: ScanPlan, request: ScanRequest): ScanResult {
  const findings: Finding[] = [];
  const failures: InspectorFailure[] = [];
  const { body, phase } = request;
  const location = bodyLocation(phase);
  const run = (inspector: string, fn: () => Finding[]) => {
    try {
      const found = fn();
      for (const f of found) findings.push(f);
    } catch (err) {
      failures.push({ inspector, reason: (err as Error).message || String(err) });
    }
  };

  if (phase === 'request' && plan.model) run(model.id, () => model.scan(body, plan.model!));

  let view: Buffer | null = null;
  const decoded = () => (view ??= scanView(body));
  if (plan.secrets && request.secrets.length > 0) {
    run(secrets.id, () => secrets.scan(decoded(), plan.secrets!, secrets.needles(request.secrets), location));
  }
  if (phase === 'request' && plan.pii) run(pii.id, () => pii.scan(decoded(), plan.pii!, location));
  if (phase === 'request' && plan.apiKey) run(apiKey.id, () => apiKey.scan(decoded(), plan.apiKey!, location));
  if (plan.patterns) run(patterns.id, () => patterns.scan(decoded(), plan.patterns!, location));
  return { findings, failures };
}
