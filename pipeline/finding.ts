// The finding record (spec: "Finding record"): exactly these five fields, nothing else.

export type FindingLocation = 'request_body' | 'response_body' | 'model' | 'sidecar';
export type Phase = 'request' | 'response';

export interface Finding {
  /** `pii`, `api_key`, `model_restriction`, `secrets`, `patterns`, `sidecar:<name>` (docs/decisions.md). */
  inspector_type: string;
  severity: 'log' | 'warn' | 'block';
  description: string;
  /** Always redacted: the first 4 characters plus `****`. */
  match: string;
  location: FindingLocation;
}

/** At most this many findings per inspector and body: distinct matches only, so a repeated value counts once. */
export const MAX_FINDINGS_PER_INSPECTOR = 64;

/** First 4 characters (code points, not bytes) followed by `****` (spec: Finding record). */
export function redact(value: string): string {
  let out = '';
  let n = 0;
  for (const ch of value) {
    if (n++ === 4) break;
    out += ch;
  }
  return out + '****';
}

export function bodyLocation(phase: Phase): FindingLocation {
  return phase === 'request' ? 'request_body' : 'response_body';
}

/** Appends `more` to `findings` in place (an inspector reading several views reports them as one list). */
export function appendAll(findings: Finding[], more: readonly Finding[]): void {
  for (const f of more) findings.push(f);
}
