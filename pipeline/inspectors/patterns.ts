import RE2 from 're2';
import { MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { CustomPattern } from '../policy/types.ts';

// patterns: custom regexes, compiled with re2 only (linear time; never V8's backtracking RegExp, which a
// user pattern could drive into ReDoS). Compiled once per policy version. One RE2.Set pass tells which
// patterns match anywhere; only those run again to extract their matches. A pattern re2 cannot compile
// is reported back for logging and skipped, never an error (spec: "Invalid regex patterns…").

export const id = 'patterns';

interface CompiledPattern {
  regex: RE2;
  severity: 'log' | 'warn' | 'block';
  description: string;
}

export interface PatternPlan {
  set: InstanceType<typeof RE2.Set> | null;
  patterns: CompiledPattern[];
  invalid: { pattern: string; reason: string }[];
}

export function compile(patterns: readonly CustomPattern[]): PatternPlan | null {
  if (patterns.length === 0) return null;
  const compiled: CompiledPattern[] = [];
  const invalid: PatternPlan['invalid'] = [];
  for (const p of patterns) {
    try {
      compiled.push({
        regex: new RE2(p.pattern, 'gu'),
        severity: recordedSeverity(p.severity),
        description: p.description || `custom pattern /${p.pattern}/`,
      });
    } catch (err) {
      invalid.push({ pattern: p.pattern, reason: (err as Error).message });
    }
  }
  let set: PatternPlan['set'] = null;
  if (compiled.length > 1) {
    try {
      set = new RE2.Set(compiled.map((c) => c.regex.source), 'u');
    } catch {
      set = null; // every pattern compiled alone; fall back to testing them one by one
    }
  }
  return { set, patterns: compiled, invalid };
}

export function scan(view: Buffer, plan: PatternPlan, location: FindingLocation): Finding[] {
  const candidates = plan.set ? plan.set.match(view) : plan.patterns.map((_, i) => i);
  const findings: Finding[] = [];
  const seen = new Set<string>();
  for (const index of candidates) {
    const p = plan.patterns[index];
    const regex = p.regex;
    regex.lastIndex = 0;
    for (;;) {
      const m = regex.exec(view) as unknown as (Buffer[] & { index: number }) | null;
      if (m === null) break;
      const text = m[0];
      if (text.length === 0) {
        // An empty match says nothing; step past it (re2 leaves lastIndex in place for those).
        regex.lastIndex = m.index + 1;
        if (regex.lastIndex > view.length) break;
        continue;
      }
      const value = text.toString('utf8');
      const key = `${index}\u0000${value}`;
      if (!seen.has(key)) {
        seen.add(key);
        findings.push({ inspector_type: id, severity: p.severity, description: p.description, match: redact(value), location });
        if (findings.length >= MAX_FINDINGS_PER_INSPECTOR) return findings;
      }
    }
  }
  return findings;
}
