import * as apiKey from './inspectors/api-key.ts';
import * as model from './inspectors/model-restriction.ts';
import * as patterns from './inspectors/patterns.ts';
import * as pii from './inspectors/pii.ts';
import type { ResolvedPolicy, Toggle } from './policy/types.ts';

// A resolved policy compiled into what the scanners run: model globs checked, regexes compiled into an
// RE2.Set. Compiling costs far more than a scan, so plans are cached by policy version, on the main
// thread and in every worker.

export interface ScanPlan {
  version: string;
  model: model.ModelPlan | null;
  secrets: Toggle | null;
  pii: pii.PiiPlan | null;
  apiKey: apiKey.ApiKeyPlan | null;
  patterns: patterns.PatternPlan | null;
}

export function compilePlan(policy: ResolvedPolicy): ScanPlan {
  const c = policy.content;
  const piiPlan = c ? pii.compile(c.pii_detection) : null;
  const apiKeyPlan = c ? apiKey.compile(c.api_key_detection) : null;
  // With custom patterns, one RE2.Set pass also prefilters the built-in detectors (patterns.ts).
  const prefilters: patterns.PrefilterId[] = [];
  if (piiPlan?.email) prefilters.push('email');
  if (piiPlan?.creditCard) prefilters.push('card');
  if (piiPlan?.ssn) prefilters.push('ssn');
  if (apiKeyPlan) prefilters.push('api_key');
  return {
    version: policy.version,
    model: model.compile(policy.models),
    secrets: c?.secrets_filter.enabled ? c.secrets_filter : null,
    pii: piiPlan,
    apiKey: apiKeyPlan,
    patterns: c ? patterns.compile(c.patterns, prefilters) : null,
  };
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
