import type { Severity } from './types.ts';

// `redact` is reserved and behaves like `warn` (spec: Severity values).
const RANK: Record<Severity, number> = { log: 0, warn: 1, redact: 1, block: 2 };

export function stronger(a: Severity, b: Severity): Severity {
  return RANK[b] > RANK[a] ? b : a;
}

/** The severity a finding records: the spec's finding record knows log, warn and block only. */
export function recordedSeverity(s: Severity): 'log' | 'warn' | 'block' {
  return s === 'redact' ? 'warn' : s;
}
