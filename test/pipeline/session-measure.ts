// Not a test: what the per-part cache's measuring scripts share (part-cache.measure.ts,
// part-cache.fresh.ts, part-cache.stages.ts): the full set with the bench's ten patterns, none of
// them blocking (so a session goes on through its planted findings), the bench's secrets, and the
// process's CPU clock.
import { BENCH_PATTERNS, BENCH_SECRETS } from '../../bench/corpus.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

export const sessionPolicy = policyFromDocument(
  validatePolicyDocument({
    model_policy: { mode: 'allowlist', models: ['claude-*', 'gpt-*'] },
    content_inspection: {
      secrets_filter: { enabled: true, severity: 'block' },
      pii_detection: { enabled: true, severity: 'warn' },
      api_key_detection: { enabled: true, severity: 'warn' },
      patterns: BENCH_PATTERNS.map((p) => ({ ...p, severity: p.severity === 'block' ? 'warn' : p.severity })),
    },
  }),
);

/** Frozen, as the proxy's are: the cache remembers a frozen array's scan context by identity. */
export const sessionSecrets = Object.freeze([...BENCH_SECRETS]);

/** User + system CPU time of this process, in milliseconds. */
export function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}
