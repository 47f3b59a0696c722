import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';

/** Every built-in inspector on (API keys blocking) and these custom patterns: the policy tests scan with. */
export function builtinsWith(patterns: { pattern: string; description: string; severity: string }[]): ResolvedPolicy {
  return policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true },
        pii_detection: { enabled: true },
        api_key_detection: { enabled: true, severity: 'block' },
        patterns,
      },
    }),
  );
}
