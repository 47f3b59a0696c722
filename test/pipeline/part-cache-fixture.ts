import type { Test } from 'tap';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine, type EngineOptions, type InspectionOutcome } from '../../pipeline/engine.ts';
import type { Finding } from '../../pipeline/finding.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// What the per-part cache's tests share (part-cache, part-cache-skeleton, part-cache-groups): a policy
// from its document, an engine with its registry, a metric's sum, and the comparison of a cached
// outcome with a whole-body scan's.

export const policyOf = (doc: unknown) => policyFromDocument(validatePolicyDocument(doc));

/** An engine (no adaptive offload: the tests choose inline or pool) closed with the test. */
export function engine(t: Test, options: EngineOptions) {
  const registry = createRegistry();
  const e = new InspectionEngine({ registry, adaptiveOffload: null, ...options });
  t.teardown(() => e.close());
  return { e, registry };
}

/** The sum of a metric's values over its labels. */
export async function metric(registry: ReturnType<typeof createRegistry>, name: string): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  return (m?.values ?? []).reduce((sum, v) => sum + v.value, 0);
}

/** Findings as comparable keys, order-free. */
export function findingKeys(findings: readonly Finding[]): string[] {
  return findings.map((f) => JSON.stringify([f.inspector_type, f.severity, f.description, f.match, f.location])).sort();
}

/** Whether two outcomes agree (same decision and findings, no failures); on a mismatch it fails `t`, saying how. */
export function same(t: Test, got: InspectionOutcome, want: InspectionOutcome, label: string): boolean {
  const ok =
    got.decision === want.decision &&
    got.failures.length === 0 &&
    want.failures.length === 0 &&
    JSON.stringify(findingKeys(got.findings)) === JSON.stringify(findingKeys(want.findings));
  if (!ok)
    t.same(
      { decision: got.decision, findings: findingKeys(got.findings), failures: got.failures },
      { decision: want.decision, findings: findingKeys(want.findings), failures: want.failures },
      label,
    );
  return ok;
}
