import RE2 from 're2';
import { appendAll, MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import type { InspectionInput } from '../inspection-input.ts';
import { defineInspector } from '../inspector.ts';
import { type Anchor, anchorOf, locate, locateNear, runsIntoEnds, windows } from '../pattern-anchors.ts';
import { MAX_REACH, patternReach } from '../pattern-reach.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { CustomPattern } from '../policy/types.ts';

// patterns: custom regexes, compiled with re2 only (linear time; never V8's backtracking RegExp, which a
// user pattern could drive into ReDoS). Compiled once per policy version. One RE2.Set pass tells which
// patterns match anywhere; only those run again to extract their matches. A pattern re2 cannot compile
// is reported back for logging and skipped, never an error (spec: "Invalid regex patterns…").
//
// A pattern with an anchor (pattern-anchors.ts: a literal each of its matches holds, and how far a
// match reaches around it) is extracted in the windows around that literal's occurrences only, not
// over the whole view. When every pattern has one cheap to find, the literals replace the set pass
// itself in a large view (`located`): finding them costs less than one RE2.Set pass over every byte
// (docs/decisions.md, "Custom patterns located by their literals").
//
// In a byte range of a larger body (byte-ranges.ts), a pattern whose matches can run on past any
// overlap (`\S{6,}`, `[: ]+`: `unbounded`) is looked for around its literal too, and the literal is in
// the set pass, so a match the range holds only the start of still makes it a candidate. Where a
// window around the literal runs into the range's first or last byte (or cannot be bounded), that
// pattern runs over the whole body's view instead (`OpenRange`, escalation): every match of the whole
// body is then found by the range that holds its literal (docs/decisions.md, "Unbounded patterns
// split by range").

export const id = 'patterns';

interface CompiledPattern {
  regex: RE2;
  /** Where its matches can be: run only around its literal (null: over the whole view). */
  anchor: Anchor | null;
  /** Its matches can hold a separator and be any length: no overlap of a byte range covers them. */
  unbounded: boolean;
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
  /**
   * Set members after the prefilters: per member, the index of the unbounded anchored pattern whose
   * literal it is (set index patterns.length + prefilters.length + i).
   */
  literalMembers: number[];
  /**
   * The unbounded anchored patterns alone (the indexes of literalMembers), for a range that escalates:
   * one pass over the whole body's view names those that match anywhere, and only they run there.
   */
  unboundedSet: InstanceType<typeof RE2.Set> | null;
  /**
   * How far a match reaches across a byte range's edge (view bytes): the longest bounded match, and for
   * an unbounded pattern its literal (the rest is found around it, OpenRange). null: the body cannot be
   * split by range for these patterns (an unbounded one without a literal, or a literal too long).
   */
  rangeReach: number | null;
  /**
   * How far a match reaches around a change of the normalized view (normalized-windows.ts): rangeReach,
   * null also when a pattern holds `\C` (it matches the byte between two windows). An unbounded pattern
   * counts its literal only: it runs over the whole view around its literal (scanNormalized).
   */
  windowReach: number | null;
  /**
   * Every pattern has an anchor and finding them all is estimated at LOCATED_MAX_COST set passes or
   * less: in a view from LOCATED_FROM_BYTES, candidates come from their literals instead (the
   * prefilters then do not run).
   */
  located: boolean;
}

/**
 * The literals replace the set pass when locating them all is estimated to cost less than this many
 * set passes (pattern-anchors.ts, LOCATOR_COST). Below one: each literal is a pass of its own over the
 * view, and on a loaded host (caches and memory shared) ten passes slow down more than one does. The
 * bench's ten patterns, three of them folded, estimate at 0.59 since the SIMD search finds folded
 * literals (literal-search.ts) and measured 0.49× the set pass's time at 1 MB, 0.67× at 8 MB with the
 * tests running beside it (at 0.84, re2 finding the folded ones, they measured 0.8–1.2×).
 */
export const LOCATED_MAX_COST = 0.75;

/**
 * …and only in a view this large. Below it the set pass costs microseconds, and each literal's search
 * a call or two of fixed cost. With the SIMD search (literal-search.ts) the literals are ahead of the
 * set pass, even though its prefilters (which locating does not run) would let the PII and API-key
 * detectors skip a body, from about 4 KB when the CPU's caches hold the scan's code and tables (the full
 * set on the bench bodies 1.15× the set plan's time at 2 KB, 0.97× at 4 KB, 0.83× at 8 KB, 0.73–0.76×
 * from 24 KB to 256 KB), and from about 8 KB when they hold other work, as in llmproxy between calls
 * (`hits` alone, 16 MB of other memory touched before each: 1.25× at 6 KB, 0.90× at 8 KB, 0.67× at
 * 12–16 KB, 0.51× at 1 MB). docs/decisions.md, "Literals found sixteen starts at a time". Before the
 * SIMD search this was 256 KB.
 */
export const LOCATED_FROM_BYTES = 8 * 1024;

/**
 * How long locating may take before the set pass runs instead, checked before each next literal: about
 * 1.4 set passes (re2 steps its DFA at 1.4–1.5 ns a byte on the bench host), nearly twice what a
 * located plan may be estimated to need, so that only adversarial bodies reach it (floods of the bytes
 * Buffer.indexOf stops at): measured, they then cost up to about three set passes.
 */
export const LOCATE_NS_PER_BYTE = 2;

/**
 * …and at least this long (ns), however small the view. In llmproxy the CPU's caches hold the rest of a
 * call's work between scans, and ten literal searches over a 5 KB view took longer than its 10 µs (2 ns
 * a byte): locating gave up on every call and the set pass ran too (profiled under `npm run bench --
 * proxy`; with 16 MB of other memory touched before each scan, 2,000 of 2,000 gave up, 49 of 2,307 with
 * this floor). A body made to run locating to this bound costs 0.1 ms more at most.
 */
export const LOCATE_MIN_NS = 100_000;

/** Why re2 cannot compile `pattern` as the engine would, or null when it can (authoring-time check). */
export function patternProblem(pattern: string): string | null {
  try {
    new RE2(pattern, 'gu');
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

export interface CompileOptions {
  /** Extract anchored patterns in windows (pattern-anchors.ts); false: the plain path (tests compare). */
  anchors?: boolean;
  /** May the literals replace the set pass (`located`); false: the set pass names the candidates. */
  located?: boolean;
}

export function compile(
  patterns: readonly CustomPattern[],
  prefilters: readonly PrefilterId[] = [],
  options: CompileOptions = {},
): PatternPlan | null {
  const anchors = options.anchors ?? true;
  if (patterns.length === 0) return null;
  const compiled: CompiledPattern[] = [];
  const invalid: PatternPlan['invalid'] = [];
  /** Per compiled pattern, patternReach of its source. */
  const reaches: (number | null)[] = [];
  for (const p of patterns) {
    try {
      const reach = patternReach(p.pattern);
      compiled.push({
        regex: new RE2(p.pattern, 'gu'),
        anchor: anchors ? anchorOf(p.pattern, 'gu') : null,
        unbounded: reach === null,
        severity: recordedSeverity(p.severity),
        description: p.description || `custom pattern /${p.pattern}/`,
      });
      reaches.push(reach);
    } catch (err) {
      invalid.push({ pattern: p.pattern, reason: (err as Error).message });
    }
  }
  let set: PatternPlan['set'] = null;
  let usedPrefilters: PrefilterId[] = [];
  const located =
    (options.located ?? true) &&
    compiled.length > 0 &&
    compiled.every((c) => c.anchor !== null) &&
    compiled.reduce((sum, c) => sum + c.anchor!.cost, 0) < LOCATED_MAX_COST;
  const literalMembers: number[] = [];
  let rangeReach: number | null = 0;
  for (let i = 0; i < compiled.length; i++) {
    const { unbounded, anchor } = compiled[i];
    let reach = reaches[i];
    if (unbounded && anchor) {
      literalMembers.push(i);
      // In view bytes: a folded letter may match a character of up to 3 UTF-8 bytes (`K` for `k`).
      reach = Math.max(...anchor.literals.map((l) => l.length)) * (anchor.fold ? 4 : 1);
    }
    rangeReach = reach === null || rangeReach === null || reach > MAX_REACH ? null : Math.max(rangeReach, reach);
  }
  if (compiled.length + prefilters.length + literalMembers.length > 1) {
    try {
      set = new RE2.Set(
        [
          ...compiled.map((c) => c.regex.source),
          ...prefilters.map((p) => PREFILTERS[p]),
          ...literalMembers.map((i) => compiled[i].anchor!.source),
        ],
        'u',
      );
      usedPrefilters = [...prefilters];
    } catch {
      set = null; // every pattern compiled alone; fall back to testing them one by one
    }
  }
  let unboundedSet: PatternPlan['unboundedSet'] = null;
  if (set && literalMembers.length > 0) {
    try {
      unboundedSet = new RE2.Set(
        literalMembers.map((i) => compiled[i].regex.source),
        'u',
      );
    } catch {
      unboundedSet = null; // each escalated pattern then runs over the whole view
    }
  }
  return {
    set,
    patterns: compiled,
    prefilters: usedPrefilters,
    invalid,
    located,
    literalMembers: set ? literalMembers : [],
    unboundedSet,
    rangeReach,
    windowReach: compiled.some((c) => c.regex.source.includes('\\C')) ? null : rangeReach,
  };
}

export interface SetHits {
  /** Indexes of custom patterns that match somewhere. */
  patterns: number[];
  /** Built-in prefilters that matched; null when the set did not run them (run every detector). */
  prefilters: Set<PrefilterId> | null;
  /** Unbounded anchored patterns whose literal occurs (PatternPlan.literalMembers); absent: not told. */
  literals?: Set<number>;
  /**
   * When the plan is `located`: per pattern, its literal's occurrences (pattern-anchors.ts, locate),
   * null past the bound (it then runs over the whole view), reused to extract. Shorter than the
   * patterns when a literal could not be located and the set pass named the candidates (the rest are
   * located as they extract).
   */
  located?: (number[] | null)[];
}

/**
 * Which custom patterns and which built-in prefilters match anywhere in `view`: one RE2.Set pass, or
 * for a `located` plan and a large view, each pattern's literal looked for (a pattern whose literal
 * occurs is a candidate: its windows may still hold no match).
 */
export function hits(view: Buffer, plan: PatternPlan): SetHits {
  if (plan.located && view.length >= LOCATED_FROM_BYTES) {
    const located: (number[] | null)[] = [];
    // The wall clock: a thread's CPU time ticks too coarsely here (about 1 ms) to judge 1 MB by, and
    // the process's counts the other workers. A scan preempted on a loaded host may give way when it
    // need not: the set pass then runs too, at most the located estimate (LOCATED_MAX_COST) more.
    const deadline = performance.now() + Math.max(view.length * LOCATE_NS_PER_BYTE, LOCATE_MIN_NS) / 1e6;
    const over = () => performance.now() > deadline;
    for (const p of plan.patterns) {
      if (located.length > 0 && over()) return { ...setPass(view, plan), located };
      const found = locate(view, p.anchor!, deadline);
      // A literal too common to locate (a flood of it), or locating slower than the set pass on this
      // body (a flood of the bytes Buffer.indexOf stops at): the set pass decides after all, once.
      // Either way the findings are the same; only the cost differs.
      if (found === null) return { ...setPass(view, plan), located };
      located.push(found);
    }
    const patterns: number[] = [];
    for (let i = 0; i < located.length; i++) if (located[i]!.length > 0) patterns.push(i);
    return { patterns, prefilters: null, located };
  }
  return setPass(view, plan);
}

function setPass(view: Buffer, plan: PatternPlan): SetHits {
  if (!plan.set) return { patterns: plan.patterns.map((_, i) => i), prefilters: null };
  const found = plan.set.match(view);
  const n = plan.patterns.length;
  const m = n + plan.prefilters.length;
  // One walk over the members that matched, sorted out by range (no filter and map per kind).
  const patterns: number[] = [];
  const prefilters = plan.prefilters.length > 0 ? new Set<PrefilterId>() : null;
  const literals = plan.literalMembers.length > 0 ? new Set<number>() : undefined;
  for (let k = 0; k < found.length; k++) {
    const i = found[k];
    if (i < n) patterns.push(i);
    else if (i < m) prefilters?.add(plan.prefilters[i - n]);
    else literals?.add(plan.literalMembers[i - m]);
  }
  const out: SetHits = { patterns, prefilters };
  if (literals) out.literals = literals;
  return out;
}

/**
 * Matches looked at per regex run. Findings are distinct values, so a body repeating one match
 * (`INC-123456 ` for megabytes) would make a match object, microseconds each, for nothing new: past
 * this many the pattern has long since reported its severity, and the run stops.
 */
export const MAX_MATCHES_PER_PATTERN = 4096;

type Match = Buffer[] & { index: number; groups?: Record<string, Buffer | undefined> };

/** Every match of `regex` over `view`, empty matches skipped. */
export function* matches(regex: RE2, view: Buffer): Generator<Match> {
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
 * Below this, a candidate the set pass named runs over the whole view: locating its literal first
 * costs about as much as the run (a few microseconds either way).
 */
export const WINDOWED_FROM_BYTES = 64 * 1024;

/**
 * Every match of a pattern over `view`, as matches() gives them, but looked for only in the windows
 * around its literal (pattern-anchors.ts): `hits` are the literal's occurrences when already located,
 * and a pattern whose literal occurs past the bound runs over the whole view.
 */
export function* anchoredMatches(
  regex: RE2,
  anchor: Anchor,
  view: Buffer,
  hits: number[] | null | undefined = locate(view, anchor),
): Generator<Match> {
  const spans = hits === null ? null : windows(view, anchor, hits);
  if (spans === null) {
    yield* matches(regex, view);
    return;
  }
  yield* windowMatches(regex, view, spans);
}

/** Every match of `regex` in the windows `spans` ([start, end) pairs, pattern-anchors.ts windows). */
function* windowMatches(regex: RE2, view: Buffer, spans: readonly number[]): Generator<Match> {
  let n = 0;
  for (let k = 0; k < spans.length; k += 2) {
    // From the window's start, the bytes before it read as context (`\b`); one byte past its end.
    const text = view.subarray(0, Math.min(view.length, spans[k + 1] + 1));
    regex.lastIndex = spans[k];
    for (;;) {
      if (n >= MAX_MATCHES_PER_PATTERN) return;
      const m = regex.exec(text) as unknown as Match | null;
      if (m === null) break;
      n++;
      yield m;
    }
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

/**
 * The view scanned is a byte range of a larger body (byte-ranges.ts): whether the body goes on before
 * its first byte and after its last, and the same stage's view of the whole body (built on first use),
 * over which an unbounded pattern runs when the range cannot hold all of its matches (escalation).
 */
export interface OpenRange {
  before: boolean;
  after: boolean;
  whole: () => Buffer | null;
  /** Patterns escalated so far, in this stage or an earlier one: a later stage runs them whole too. */
  escalated: Set<number>;
}

/**
 * The candidates in a range: what the set pass named, and every unbounded pattern whose literal
 * occurs (the range may hold only the start of its match, which the set pass cannot name).
 */
function rangeCandidates(plan: PatternPlan, setHits: SetHits): number[] {
  const out = [...setHits.patterns];
  const named = new Set(out);
  for (let i = 0; i < plan.patterns.length; i++) {
    if (!plan.patterns[i].unbounded || named.has(i)) continue;
    if (setHits.literals?.has(i) || (setHits.located?.[i]?.length ?? 0) > 0) out.push(i);
  }
  return out;
}

/** Which of the escalated patterns match somewhere in the whole body's view (PatternPlan.unboundedSet). */
function namedOver(view: Buffer, plan: PatternPlan, escalated: readonly number[]): number[] {
  if (!plan.unboundedSet) return [...escalated];
  const named = new Set(plan.unboundedSet.match(view).map((k) => plan.literalMembers[k]));
  return escalated.filter((i) => named.has(i));
}

/** Whether a window runs into the range's first or last byte where the body goes on. */
function runsPastRange(spans: readonly number[], length: number, range: OpenRange): boolean {
  if (spans.length === 0) return false;
  return (range.before && spans[0] === 0) || (range.after && spans[spans.length - 1] >= length);
}

export function scan(
  view: Buffer,
  plan: PatternPlan,
  location: FindingLocation,
  setHits: SetHits = hits(view, plan),
  range: OpenRange | null = null,
): Finding[] {
  // Anchored candidates run in their windows, each alone; the rest as one alternation over the view.
  // An anchored candidate only located (its literal occurs) counts once it has a match: the share of
  // the bound below is then what the set pass, which names only patterns that match, would give.
  // In a range, an unbounded candidate whose windows the range cannot hold escalates: it runs over the
  // whole body's view after the rest.
  // A whole view with no candidate has nothing to find (most small bodies): none of the run's
  // structures is built.
  if (range === null && setHits.patterns.length === 0) return [];
  const runs = new Map<number, { first: Match; rest: Generator<Match> }>();
  const whole: number[] = [];
  const escalated: number[] = range ? [...range.escalated] : [];
  const named = new Set(setHits.patterns);
  for (const index of range ? rangeCandidates(plan, setHits) : setHits.patterns) {
    const { regex, anchor } = plan.patterns[index];
    if (range && plan.patterns[index].unbounded) {
      if (range.escalated.has(index)) continue;
      // Named by the literal alone, not by the set pass over this view: no match lies inside the
      // range, and only one running past an end of it can hold the literal here.
      if (!setHits.located && !named.has(index)) {
        if (anchor === null || runsIntoEnds(view, anchor, null, range.before, range.after)) {
          escalated.push(index);
          range.escalated.add(index);
        }
        continue;
      }
      const found = anchor ? (setHits.located?.[index] ?? locate(view, anchor)) : null;
      const spans = found === null ? null : windows(view, anchor!, found);
      // No windows (a flood of the literal, suffix walks past their budget): the pattern runs over the
      // range's view when no match around any occurrence can reach either end of it.
      const past =
        spans === null
          ? anchor === null || runsIntoEnds(view, anchor, found, range.before, range.after)
          : runsPastRange(spans, view.length, range);
      if (past) {
        escalated.push(index);
        range.escalated.add(index);
        continue;
      }
      const rest = spans === null ? matches(regex, view) : windowMatches(regex, view, spans);
      const first = rest.next();
      if (!first.done) runs.set(index, { first: first.value, rest });
      continue;
    }
    if (anchor === null) {
      whole.push(index);
      continue;
    }
    const rest =
      setHits.located || view.length >= WINDOWED_FROM_BYTES
        ? anchoredMatches(regex, anchor, view, setHits.located?.[index])
        : matches(regex, view);
    const first = rest.next();
    if (!first.done) runs.set(index, { first: first.value, rest });
  }
  // Escalated patterns run over the whole body's view only where one set pass there names them: one
  // that matches nowhere costs that pass, not a run (or a search for its literal) of its own.
  const wholeView = escalated.length > 0 ? range!.whole() : null;
  const reaching = wholeView ? namedOver(wholeView, plan, escalated) : [];
  const matching = runs.size + whole.length + reaching.length;
  const findings: Finding[] = [];
  const seen = new Set<string>();
  // The findings bound is shared out per pattern, never spent by one: 64 distinct matches of a `log`
  // pattern must not hide the one match of a `block` pattern after them (every candidate the set
  // reported yields at least one finding).
  const perPattern = Math.max(1, Math.floor(MAX_FINDINGS_PER_INSPECTOR / Math.max(1, matching)));
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
  // The anchored runs merged by offset: findings in order of appearance, as one alternation gives.
  const heads = [...runs].map(([index, run]) => ({ index, m: run.first as Match | null, rest: run.rest }));
  for (;;) {
    let next: (typeof heads)[number] | null = null;
    for (const h of heads) if (h.m && (!next || h.m.index < next.m!.index)) next = h;
    if (!next) break;
    next.m = add(next.index, next.m![0]) ? (next.rest.next().value ?? null) : null;
  }
  let alone = whole;
  const together = whole.length > 1 ? combined(plan, whole) : null;
  if (together) {
    const found = new Set<number>();
    for (const m of matches(together, view)) {
      const index = whole.find((i) => m.groups?.[`dvx${i}`] !== undefined);
      if (index === undefined) continue;
      found.add(index);
      add(index, m[0]);
      if (full === matching) break;
    }
    // A candidate the combined run did not reach (another pattern's matches used up its match bound,
    // or matched the same text first) runs alone.
    alone = whole.filter((i) => !found.has(i));
  }
  for (const index of alone) {
    for (const m of matches(plan.patterns[index].regex, view)) if (!add(index, m[0])) break;
  }
  if (wholeView) {
    for (const index of reaching) {
      const { regex, anchor } = plan.patterns[index];
      const found = anchor ? anchoredMatches(regex, anchor, wholeView) : matches(regex, wholeView);
      for (const m of found) if (!add(index, m[0])) break;
    }
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
    const findings = scan(input.decoded(), plan, input.location, setHits, input.openRange('literal'));
    const joined = input.joined();
    if (joined) appendAll(findings, scan(joined, plan, input.location));
    return findings;
  },
  scanNormalized(input, plan) {
    const view = input.normalizedStage();
    if (view && view !== input.normalized()) return inWindows(input, plan, view);
    const viewHits = view ? input.setHits('normalized') : null;
    const range = input.openRange('normalized');
    // A pattern the literal stage escalated runs over the whole normalized view even where this
    // range's own reads the same as its literal view (normalized() null): elsewhere it may not.
    const findings =
      view && viewHits
        ? viewHits.patterns.length > 0 || range
          ? scan(view, plan, input.location, viewHits, range)
          : []
        : range && range.escalated.size > 0
          ? scan(Buffer.alloc(0), plan, input.location, { patterns: [], prefilters: null }, range)
          : [];
    const joined = input.normalizedJoined();
    if (joined) appendAll(findings, scan(joined, plan, input.location));
    return findings;
  },
});

/**
 * What locateNear may walk and search, for all the unbounded patterns of one normalized stage together:
 * this share of the view's bytes (at least NEAR_BUDGET_MIN); past it, one set pass over the whole view
 * names them instead (what reading the whole view costs). An attacker review forced 2.3–4.9× the whole
 * view's time without it (many unbounded patterns, long runs of the bytes their suffixes hold).
 */
const NEAR_BUDGET = 1 / 8;
const NEAR_BUDGET_MIN = 64 * 1024;

/**
 * The normalized stage when it reads windows around what normalization changed (normalized-windows.ts):
 * the bounded patterns the set pass names there run there. An unbounded one runs over the whole view
 * around the occurrences of its literal that a match holding a change can hold (locateNear), when that
 * literal occurs in the windows or in the decoded view at all (a match of the whole view holds its
 * literal, and a literal away from every change is the decoded view's bytes).
 */
function inWindows(input: InspectionInput, plan: PatternPlan, windows: Buffer): Finding[] {
  const windowHits = input.setHits('normalized');
  if (!windowHits) return []; // the set pass failed, and said so
  const bounded = windowHits.patterns.filter((i) => !plan.patterns[i].unbounded);
  const findings = bounded.length > 0 ? scan(windows, plan, input.location, { ...windowHits, patterns: bounded }) : [];
  const decodedHits = input.setHits('literal');
  const unbounded: number[] = [];
  for (let i = 0; i < plan.patterns.length; i++) {
    if (plan.patterns[i].unbounded && (literalMayOccur(windowHits, i) || literalMayOccur(decodedHits, i)))
      unbounded.push(i);
  }
  if (unbounded.length > 0) {
    // Each around its literal's occurrences near a change only: a match away from every change is the
    // decoded view's, which the literal stage read.
    const view = input.normalized()!;
    const changes = input.normalizedChanges()!;
    const located: (number[] | null)[] = [];
    const budget = { left: Math.max(NEAR_BUDGET_MIN, view.length * NEAR_BUDGET) };
    let over = false;
    for (const i of unbounded) {
      const found = locateNear(view, plan.patterns[i].anchor!, changes, budget);
      if (found === false) {
        over = true;
        break;
      }
      located[i] = found;
    }
    if (!over)
      appendAll(findings, scan(view, plan, input.location, { patterns: unbounded, prefilters: null, located }));
    else {
      // Past the budget (long runs a suffix or a prefix lives through, many such patterns): as the whole
      // view is read, one set pass names those that match, and they run around their literal.
      const whole = hits(view, plan);
      const named = new Set(whole.patterns);
      const candidates = unbounded.filter((i) => named.has(i));
      if (candidates.length > 0)
        appendAll(findings, scan(view, plan, input.location, { ...whole, patterns: candidates }));
    }
  }
  const joined = input.normalizedJoined();
  if (joined) appendAll(findings, scan(joined, plan, input.location));
  return findings;
}

/** Whether a set pass (or the literals located instead) leaves open that pattern `i`'s literal occurs. */
function literalMayOccur(setHits: SetHits | null, i: number): boolean {
  if (setHits === null) return true;
  const found = setHits.located?.[i];
  if (found !== undefined) return found === null || found.length > 0;
  return setHits.literals ? setHits.literals.has(i) : true;
}
