import { MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { defineInspector } from '../inspector.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { Toggle } from '../policy/types.ts';
import { CLASS, DIGIT, KEY_BODY, ALPHA, isAlnum, keyRunEnd, nextByte, wordBefore } from '../byte-class.ts';

// api_key: the spec's 11 prefixes (AKIA, ghp_, ghs_, github_pat_, sk-ant-, AIza, sk-, sk_test_,
// sk_live_, pk_test_, pk_live_), each followed by a plausible key body, so a prefix named in prose
// ("keys start with sk-") is not a finding. Prefilter: memchr-speed indexOf on `AKIA`, `AIza`, `_` and
// `-`; every hit is classified by the bytes just before it. A key must start at a token boundary.
// `sk-ant-…` is reported once, as an Anthropic key, never again as a generic `sk-` key.

export const id = 'api_key';

export interface ApiKeyPlan {
  severity: 'log' | 'warn' | 'block';
}

export function compile(toggle: Toggle): ApiKeyPlan | null {
  return toggle.enabled ? { severity: recordedSeverity(toggle.severity) } : null;
}

interface KeyShape {
  description: string;
  /** Allowed body bytes. */
  body: number;
  min: number;
  max: number;
  /** Body must hold a digit (random keys do; hyphenated prose does not). */
  needsDigit: boolean;
  /** Body must hold this many letters and digits in a row (random keys do; `sk-2024-q3-budget` does not). */
  minRun?: number;
}

const UPPER_OR_DIGIT = 64;
const ALNUM = 128;
const CLS = new Uint8Array(CLASS);
for (let b = 0x30; b <= 0x39; b++) CLS[b] |= UPPER_OR_DIGIT | ALNUM;
for (let b = 0x41; b <= 0x5a; b++) CLS[b] |= UPPER_OR_DIGIT | ALNUM;
for (let b = 0x61; b <= 0x7a; b++) CLS[b] |= ALNUM;
const ALNUM_US = 256;
const CLS2 = new Uint16Array(256);
for (let b = 0; b < 256; b++) CLS2[b] = CLS[b] | (CLS[b] & ALNUM || b === 0x5f ? ALNUM_US : 0);

const SHAPES = {
  aws: { description: 'AWS access key ID', body: UPPER_OR_DIGIT, min: 16, max: 16, needsDigit: false },
  google: { description: 'Google API key', body: KEY_BODY, min: 35, max: 35, needsDigit: false },
  github: { description: 'GitHub token', body: ALNUM, min: 36, max: 255, needsDigit: false },
  githubPat: {
    description: 'GitHub fine-grained personal access token',
    body: ALNUM_US,
    min: 22,
    max: 255,
    needsDigit: false,
  },
  anthropic: { description: 'Anthropic API key', body: KEY_BODY, min: 20, max: 255, needsDigit: true, minRun: 16 },
  openai: { description: 'secret key (sk-)', body: KEY_BODY, min: 20, max: 255, needsDigit: true, minRun: 16 },
  stripeSecretTest: { description: 'Stripe secret key (test)', body: ALNUM, min: 16, max: 255, needsDigit: true },
  stripeSecretLive: { description: 'Stripe secret key (live)', body: ALNUM, min: 16, max: 255, needsDigit: true },
  stripePublicTest: { description: 'Stripe publishable key (test)', body: ALNUM, min: 16, max: 255, needsDigit: true },
  stripePublicLive: { description: 'Stripe publishable key (live)', body: ALNUM, min: 16, max: 255, needsDigit: true },
} satisfies Record<string, KeyShape>;

function at(view: Buffer, i: number, text: string): boolean {
  if (i < 0 || i + text.length > view.length) return false;
  for (let k = 0; k < text.length; k++) if (view[i + k] !== text.charCodeAt(k)) return false;
  return true;
}

/** The key starting at `start` whose body starts at `bodyStart`, or null when the body is implausible. */
function keyAt(view: Buffer, start: number, bodyStart: number, shape: KeyShape): string | null {
  if (wordBefore(view, start, [0x5f, 0x2d])) return null;
  let end = bodyStart;
  let digit = false;
  let letter = false;
  let run = 0;
  let longestRun = 0;
  while (end < view.length && end - bodyStart <= shape.max && CLS2[view[end]] & shape.body) {
    if (CLASS[view[end]] & DIGIT) digit = true;
    else if (CLASS[view[end]] & ALPHA) letter = true;
    run = isAlnum(view[end]) ? run + 1 : 0;
    if (run > longestRun) longestRun = run;
    end++;
  }
  const len = end - bodyStart;
  if (len < shape.min || len > shape.max) return null;
  if (shape.needsDigit && !(digit && letter)) return null;
  if (shape.minRun !== undefined && longestRun < shape.minRun) return null;
  // A fixed-length key followed by more key bytes is part of something longer.
  if (shape.min === shape.max && end < view.length && isAlnum(view[end])) return null;
  return view.toString('latin1', start, end);
}

function past(view: Buffer, i: number): number {
  return view[i - 1] === 0x5c ? i + 1 : keyRunEnd(view, i + 1);
}

/**
 * The keys in `view`, as findings (redacted). `onValue`, when given, is told every distinct key in full,
 * past the findings' cap: the tool-call record's redaction (pipeline/tool-policy/redact.ts) replaces them.
 */
export function scan(
  view: Buffer,
  plan: ApiKeyPlan,
  location: FindingLocation,
  onValue?: (value: string) => void,
): Finding[] {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const add = (shape: KeyShape, key: string | null) => {
    if (key === null || seen.has(key)) return;
    if (onValue) {
      seen.add(key);
      onValue(key);
    }
    if (findings.length >= MAX_FINDINGS_PER_INSPECTOR) return;
    seen.add(key);
    findings.push({
      inspector_type: id,
      severity: plan.severity,
      description: shape.description,
      match: redact(key),
      location,
    });
  };

  // A key starts where a run of key bytes ([A-Za-z0-9_-]) starts (or just after the letter of an
  // escape that starts one: `\nAKIA…`), so once a prefix has been tried, no later prefix in the same
  // run can start a key: the search goes on past the run. A prefix flood (`AKIAAKIA…`, `sk-sk-…`,
  // `ghp_ghp_…`) is one run, looked at once. (A hit that is itself an escape letter, `\-sk-…`, can
  // have a key start right after it: the search goes on from the next byte.)
  for (let i = view.indexOf('AKIA'); i >= 0; i = view.indexOf('AKIA', past(view, i)))
    add(SHAPES.aws, keyAt(view, i, i + 4, SHAPES.aws));
  for (let i = view.indexOf('AIza'); i >= 0; i = view.indexOf('AIza', past(view, i)))
    add(SHAPES.google, keyAt(view, i, i + 4, SHAPES.google));

  // `-`: sk-ant-… and sk-…
  for (let i = view.indexOf(0x2d); i >= 0; i = nextByte(view, 0x2d, past(view, i))) {
    if (view[i - 1] !== 0x6b || view[i - 2] !== 0x73) continue; // "sk-"
    if (at(view, i + 1, 'ant-')) add(SHAPES.anthropic, keyAt(view, i - 2, i + 5, SHAPES.anthropic));
    else add(SHAPES.openai, keyAt(view, i - 2, i + 1, SHAPES.openai));
  }

  // `_`: ghp_, ghs_, github_pat_, sk_test_, sk_live_, pk_test_, pk_live_
  for (let i = view.indexOf(0x5f); i >= 0; i = nextByte(view, 0x5f, past(view, i))) {
    const p1 = view[i - 1];
    if ((p1 === 0x70 || p1 === 0x73) && view[i - 2] === 0x68 && view[i - 3] === 0x67) {
      add(SHAPES.github, keyAt(view, i - 3, i + 1, SHAPES.github));
    } else if (p1 === 0x62 && at(view, i - 6, 'github') && at(view, i + 1, 'pat_')) {
      add(SHAPES.githubPat, keyAt(view, i - 6, i + 5, SHAPES.githubPat));
    } else if (p1 === 0x6b && (view[i - 2] === 0x73 || view[i - 2] === 0x70)) {
      const secret = view[i - 2] === 0x73;
      if (at(view, i + 1, 'test_'))
        add(
          secret ? SHAPES.stripeSecretTest : SHAPES.stripePublicTest,
          keyAt(view, i - 2, i + 6, secret ? SHAPES.stripeSecretTest : SHAPES.stripePublicTest),
        );
      else if (at(view, i + 1, 'live_'))
        add(
          secret ? SHAPES.stripeSecretLive : SHAPES.stripePublicLive,
          keyAt(view, i - 2, i + 6, secret ? SHAPES.stripeSecretLive : SHAPES.stripePublicLive),
        );
    }
  }
  return findings;
}

/** The contract's face: the literal view, then the normalized one, each skipped when its prefilter misses. */
export const inspector = defineInspector<ApiKeyPlan>({
  id,
  phases: ['request'],
  compile: (policy) => (policy.content ? compile(policy.content.api_key_detection) : null),
  prefilters: () => ['api_key'],
  scan(input, plan) {
    const prefiltered = input.prefilters('literal');
    return !prefiltered || prefiltered.has('api_key') ? scan(input.literal(), plan, input.location) : [];
  },
  scanNormalized(input, plan) {
    const view = input.normalizedStage();
    if (!view) return [];
    const prefiltered = input.prefilters('normalized');
    return !prefiltered || prefiltered.has('api_key') ? scan(view, plan, input.location) : [];
  },
});
