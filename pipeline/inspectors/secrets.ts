import { appendAll, MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { defineInspector } from '../inspector.ts';
import { caseFold, foldedText, normalizeText } from '../normalized-view.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { Toggle } from '../policy/types.ts';

// secrets: the agent's own secret values (≥ 8 characters) as needles, raw, in JSON-escaped form and
// normalized (normalized-view.ts), matched in any letter case (spec: "Secrets filter"; docs/decisions.md,
// "Evasion: the normalized view"). A match is reported as its first 4 characters + `****`; the value itself never
// leaves this function: not in a finding, a log line or an error.
//
// Any case, at indexOf speed: an ASCII form is looked for by its longest run of bytes that have no
// case (digits, punctuation: `-2026` in `s3cr3t-db-password-2026`), and each hit compared in any case
// around it. When hits cost more than folding the whole view would (an anchor of one common byte), or
// a form has no such run or is not ASCII, the view is folded once (ASCII at native speed) and searched.

export const id = 'secrets';
export const MIN_SECRET_LENGTH = 8;

export interface SecretForm {
  /** The form in lower case (caseFold). */
  folded: string;
  /** ASCII forms: the lower-case bytes, and the longest run without letters, where it starts. */
  bytes: Buffer | null;
  anchor: Buffer | null;
  /** The anchor's bytes as a latin1 string (one character per byte), to search a small view's text. */
  anchorText: string;
  anchorAt: number;
}

export interface SecretNeedle {
  redacted: string;
  forms: SecretForm[];
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
    const folded = new Set([value, JSON.stringify(value).slice(1, -1), normalizeText(value)].map(caseFold));
    out.push({ redacted: redact(value), forms: [...folded].map(form) });
  }
  return out;
}

function isLetter(b: number): boolean {
  return (b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a;
}

function form(folded: string): SecretForm {
  const ascii = /^[\x00-\x7f]*$/.test(folded);
  if (!ascii) return { folded, bytes: null, anchor: null, anchorText: '', anchorAt: 0 };
  const bytes = Buffer.from(folded, 'latin1');
  let best = -1;
  let bestLength = 0;
  for (let i = 0; i < bytes.length; ) {
    if (isLetter(bytes[i])) {
      i++;
      continue;
    }
    let j = i;
    while (j < bytes.length && !isLetter(bytes[j])) j++;
    if (j - i > bestLength) [best, bestLength] = [i, j - i];
    i = j;
  }
  return {
    folded,
    bytes,
    anchor: best < 0 ? null : bytes.subarray(best, best + bestLength),
    anchorText: best < 0 ? '' : folded.slice(best, best + bestLength),
    anchorAt: best < 0 ? 0 : best,
  };
}

/**
 * Views up to this long have their anchors looked for in their latin1 text, made once per view: one
 * character per byte, so the same offsets, and String.prototype.indexOf is a builtin where each
 * Buffer.indexOf pays a native binding's fixed cost (about 100 ns, most of a 300-byte view's search).
 */
export const TEXT_SEARCH_BYTES = 1024;

/**
 * Whether `view` holds the ASCII form in any case; null when its hits spent the budget first. `text`:
 * the view as latin1 (TEXT_SEARCH_BYTES), searched instead of its bytes.
 */
function anchored(view: Buffer, f: SecretForm, budget: { left: number }, text: string | null): boolean | null {
  const bytes = f.bytes!;
  const anchor = f.anchor!;
  const m = bytes.length;
  for (
    let i = text === null ? view.indexOf(anchor) : text.indexOf(f.anchorText);
    i >= 0;
    i = text === null ? view.indexOf(anchor, i + 1) : text.indexOf(f.anchorText, i + 1)
  ) {
    budget.left -= 32 + m;
    if (budget.left < 0) return null;
    const start = i - f.anchorAt;
    if (start < 0 || start + m > view.length) continue;
    let k = 0;
    while (k < m) {
      let b = view[start + k];
      if (b >= 0x41 && b <= 0x5a) b |= 0x20;
      if (b !== bytes[k]) break;
      k++;
    }
    if (k === m) return true;
  }
  return false;
}

export function scan(
  view: Buffer,
  toggle: Toggle,
  secretNeedles: readonly SecretNeedle[],
  location: FindingLocation,
  searchText = view.length <= TEXT_SEARCH_BYTES,
): Finding[] {
  const findings: Finding[] = [];
  const severity = recordedSeverity(toggle.severity);
  // Verifying anchor hits may cost about as much as folding the view once; past that, fold.
  const budget = { left: view.length + 4096 };
  let text: string | null = null;
  let latin1: string | null = null;
  const holds = (f: SecretForm): boolean => {
    if (f.anchor !== null && budget.left >= 0) {
      if (searchText) latin1 ??= view.toString('latin1');
      const found = anchored(view, f, budget, latin1);
      if (found !== null) return found;
    }
    return (text ??= foldedText(view)).includes(f.folded);
  };
  for (const needle of secretNeedles) {
    if (needle.forms.some(holds)) {
      findings.push({
        inspector_type: id,
        severity,
        description: "value of one of the agent's secrets",
        match: needle.redacted,
        location,
      });
      if (findings.length >= MAX_FINDINGS_PER_INSPECTOR) break;
    }
  }
  return findings;
}

/**
 * The contract's face. As sent (raw and JSON-escaped needles), and decoded when escapes could hide a
 * value. Both: a secret holding a backslash (`Pa\ss\nw0rd`) is found as sent, and decoding a level
 * further would turn its `\n` into a newline. A stream is also read as the text the agent receives.
 */
export const inspector = defineInspector<Toggle>({
  id,
  phases: ['request', 'response'],
  readsJoined: true,
  compile: (policy) => (policy.content?.secrets_filter.enabled ? policy.content.secrets_filter : null),
  needsSecrets: true,
  scan(input, toggle) {
    const secretNeedles = needles(input.secrets);
    const findings = scan(input.raw, toggle, secretNeedles, input.location);
    const literal = input.literal();
    if (literal !== input.raw) appendAll(findings, scan(literal, toggle, secretNeedles, input.location));
    const joined = input.joined();
    if (joined) appendAll(findings, scan(joined, toggle, secretNeedles, input.location));
    return findings;
  },
  scanNormalized(input, toggle) {
    const view = input.normalizedStage();
    const joined = input.normalizedJoined();
    if (!view && !joined) return [];
    const secretNeedles = needles(input.secrets);
    const findings = view ? scan(view, toggle, secretNeedles, input.location) : [];
    if (joined) appendAll(findings, scan(joined, toggle, secretNeedles, input.location));
    return findings;
  },
});
