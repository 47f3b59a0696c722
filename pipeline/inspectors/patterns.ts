import RE2 from 're2';
import { appendAll, MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { defineInspector } from '../inspector.ts';
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

/**
 * Cheap regexes for the built-in detectors, added to the same RE2.Set: the pass the custom patterns
 * pay for anyway then also says whether a body can hold an email, a card, an SSN or a key at all, and
 * the hand-written confirming scanners run only for those that hit. A prefilter must match wherever
 * its detector could find something (it may match more, never less).
 */
export const PREFILTERS = {
  email: '[A-Za-z0-9._%+-]@[A-Za-z0-9-]+\\.',
  card: '[0-9](?:[ -]?[0-9]){12}',
  ssn: '[0-9]{3}-[0-9]{2}-[0-9]{4}',
  api_key: 'AKIA|AIza|gh[ps]_|github_pat_|sk-|[sp]k_(?:test|live)_',
} as const;
export type PrefilterId = keyof typeof PREFILTERS;

export interface PatternPlan {
  set: InstanceType<typeof RE2.Set> | null;
  patterns: CompiledPattern[];
  /** Built-in prefilters in the set after the custom patterns: set index patterns.length + i. */
  prefilters: PrefilterId[];
  invalid: { pattern: string; reason: string }[];
}

/** Why re2 cannot compile `pattern` as the engine would, or null when it can (authoring-time check). */
export function patternProblem(pattern: string): string | null {
  try {
    new RE2(pattern, 'gu');
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

export function compile(
  patterns: readonly CustomPattern[],
  prefilters: readonly PrefilterId[] = [],
): PatternPlan | null {
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
  let usedPrefilters: PrefilterId[] = [];
  if (compiled.length + prefilters.length > 1) {
    try {
      set = new RE2.Set([...compiled.map((c) => c.regex.source), ...prefilters.map((p) => PREFILTERS[p])], 'u');
      usedPrefilters = [...prefilters];
    } catch {
      set = null; // every pattern compiled alone; fall back to testing them one by one
    }
  }
  return { set, patterns: compiled, prefilters: usedPrefilters, invalid };
}

export interface SetHits {
  /** Indexes of custom patterns that match somewhere. */
  patterns: number[];
  /** Built-in prefilters that matched; null when the set did not run them (run every detector). */
  prefilters: Set<PrefilterId> | null;
}

/** One RE2.Set pass: which custom patterns and which built-in prefilters match anywhere in `view`. */
export function hits(view: Buffer, plan: PatternPlan): SetHits {
  if (!plan.set) return { patterns: plan.patterns.map((_, i) => i), prefilters: null };
  const found = plan.set.match(view);
  const n = plan.patterns.length;
  return {
    patterns: found.filter((i) => i < n),
    prefilters:
      plan.prefilters.length > 0 ? new Set(found.filter((i) => i >= n).map((i) => plan.prefilters[i - n])) : null,
  };
}

/**
 * Matches looked at per regex run. Findings are distinct values, so a body repeating one match
 * (`INC-123456 ` for megabytes) would make a match object, microseconds each, for nothing new: past
 * this many the pattern has long since reported its severity, and the run stops.
 */
export const MAX_MATCHES_PER_PATTERN = 4096;

type Match = Buffer[] & { index: number; groups?: Record<string, Buffer | undefined> };

/** Every match of `regex` over `view`, empty matches skipped. */
function* matches(regex: RE2, view: Buffer): Generator<Match> {
  regex.lastIndex = 0;
  for (let n = 0; n < MAX_MATCHES_PER_PATTERN; n++) {
    const m = regex.exec(view) as unknown as Match | null;
    if (m === null) return;
    if (m[0].length === 0) {
      // An empty match says nothing; step past it (re2 leaves lastIndex in place for those).
      regex.lastIndex = m.index + 1;
      if (regex.lastIndex > view.length) return;
      continue;
    }
    yield m;
  }
}

/**
 * Several hitting patterns are extracted in one pass: one alternation with a named group per pattern,
 * compiled once per set of candidates. Where two patterns match the same text the alternation reports
 * the first; a candidate left with no match is then run alone, so every pattern the set reported
 * yields its findings.
 */
const combinedCache = new WeakMap<PatternPlan, Map<string, RE2 | null>>();

function combined(plan: PatternPlan, candidates: readonly number[]): RE2 | null {
  let cache = combinedCache.get(plan);
  if (!cache) combinedCache.set(plan, (cache = new Map()));
  const key = candidates.join(',');
  let regex = cache.get(key);
  if (regex === undefined) {
    try {
      regex = new RE2(candidates.map((i) => `(?P<dvx${i}>${plan.patterns[i].regex.source})`).join('|'), 'gu');
    } catch {
      regex = null; // e.g. patterns sharing a group name: run them one by one
    }
    if (cache.size >= 64) cache.delete(cache.keys().next().value!);
    cache.set(key, regex);
  }
  return regex;
}

export function scan(
  view: Buffer,
  plan: PatternPlan,
  location: FindingLocation,
  candidates: readonly number[] = hits(view, plan).patterns,
): Finding[] {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  // The findings bound is shared out per pattern, never spent by one: 64 distinct matches of a `log`
  // pattern must not hide the one match of a `block` pattern after them (every candidate the set
  // reported yields at least one finding).
  const perPattern = Math.max(1, Math.floor(MAX_FINDINGS_PER_INSPECTOR / Math.max(1, candidates.length)));
  const counts = new Map<number, number>();
  let full = 0;
  /** Records a match; false once this pattern has its share. */
  const add = (index: number, text: Buffer): boolean => {
    const n = counts.get(index) ?? 0;
    if (n >= perPattern) return false;
    const p = plan.patterns[index];
    const value = text.toString('utf8');
    const key = `${index}\u0000${value}`;
    if (!seen.has(key)) {
      seen.add(key);
      findings.push({
        inspector_type: id,
        severity: p.severity,
        description: p.description,
        match: redact(value),
        location,
      });
      counts.set(index, n + 1);
      if (n + 1 === perPattern) full++;
    }
    return n + 1 < perPattern;
  };
  let alone = candidates;
  const together = candidates.length > 1 ? combined(plan, candidates) : null;
  if (together) {
    const found = new Set<number>();
    for (const m of matches(together, view)) {
      const index = candidates.find((i) => m.groups?.[`dvx${i}`] !== undefined);
      if (index === undefined) continue;
      found.add(index);
      add(index, m[0]);
      if (full === candidates.length) break;
    }
    // A candidate the combined run did not reach (another pattern's matches used up its match bound,
    // or matched the same text first) runs alone.
    alone = candidates.filter((i) => !found.has(i));
  }
  for (const index of alone) {
    for (const m of matches(plan.patterns[index].regex, view)) if (!add(index, m[0])) break;
  }
  return findings;
}

/**
 * The contract's face: the decoded view (escapes such as `\n` and `\"` change what a regex matches),
 * candidates from its set pass, and a stream's joined text; then the normalized views likewise.
 */
export const inspector = defineInspector<PatternPlan>({
  id,
  phases: ['request', 'response'],
  readsDecoded: true,
  readsJoined: true,
  compile: (policy, context) => (policy.content ? compile(policy.content.patterns, context.prefilters) : null),
  warnings: (plan) =>
    plan.invalid.map((p) => ({
      message: 'invalid custom pattern skipped',
      fields: { pattern: p.pattern, reason: p.reason },
    })),
  scan(input, plan) {
    const setHits = input.setHits('literal');
    if (!setHits) return []; // the set pass failed, and said so
    const findings = scan(input.decoded(), plan, input.location, setHits.patterns);
    const joined = input.joined();
    if (joined) appendAll(findings, scan(joined, plan, input.location));
    return findings;
  },
  scanNormalized(input, plan) {
    const view = input.normalized();
    const viewHits = view ? input.setHits('normalized') : null;
    const candidates = viewHits?.patterns ?? [];
    const findings = view && candidates.length > 0 ? scan(view, plan, input.location, candidates) : [];
    const joined = input.normalizedJoined();
    if (joined) appendAll(findings, scan(joined, plan, input.location));
    return findings;
  },
});
