import { MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { Toggle } from '../policy/types.ts';

// secrets: the agent's own secret values (≥ 8 characters) as needles, raw and in JSON-escaped form
// (spec: "Secrets filter"). A match is reported as its first 4 characters + `****`; the value itself
// never leaves this function: not in a finding, a log line or an error.

export const id = 'secrets';
export const MIN_SECRET_LENGTH = 8;

export interface SecretNeedle {
  redacted: string;
  forms: Buffer[];
}

// An agent's secrets change rarely and are scanned on every call: their needles are kept, keyed by
// the values themselves (in memory only, like the values), a bounded number of sets.
// A frozen array (the proxy's secret source hands out one per agent) is looked up by identity.
const NEEDLE_CACHE_SIZE = 1024;
const cache = new Map<string, SecretNeedle[]>();
const byArray = new WeakMap<readonly string[], SecretNeedle[]>();

/** Needles for the values worth scanning; shorter values are skipped as the spec says. */
export function needles(values: readonly string[]): SecretNeedle[] {
  const frozen = Object.isFrozen(values);
  let out = frozen ? byArray.get(values) : undefined;
  if (out !== undefined) return out;
  const key = JSON.stringify(values);
  out = cache.get(key);
  if (out === undefined) {
    out = build(values);
    if (cache.size >= NEEDLE_CACHE_SIZE) cache.clear();
    cache.set(key, out);
  }
  if (frozen) byArray.set(values, out);
  return out;
}

function build(values: readonly string[]): SecretNeedle[] {
  const out: SecretNeedle[] = [];
  const seen = new Set<string>();
  for (const value of values) {
    if (typeof value !== 'string' || [...value].length < MIN_SECRET_LENGTH || seen.has(value)) continue;
    seen.add(value);
    const forms = [Buffer.from(value, 'utf8')];
    const escaped = JSON.stringify(value).slice(1, -1);
    if (escaped !== value) forms.push(Buffer.from(escaped, 'utf8'));
    out.push({ redacted: redact(value), forms });
  }
  return out;
}

export function scan(view: Buffer, toggle: Toggle, secretNeedles: readonly SecretNeedle[], location: FindingLocation): Finding[] {
  const findings: Finding[] = [];
  const severity = recordedSeverity(toggle.severity);
  for (const needle of secretNeedles) {
    if (needle.forms.some((form) => view.indexOf(form) >= 0)) {
      findings.push({ inspector_type: id, severity, description: 'value of one of the agent\'s secrets', match: needle.redacted, location });
      if (findings.length >= MAX_FINDINGS_PER_INSPECTOR) break;
    }
  }
  return findings;
}
