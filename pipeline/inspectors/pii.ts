import { MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type FindingLocation } from '../finding.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { PiiToggle } from '../policy/types.ts';
import { ALPHA, CLASS, EMAIL_DOMAIN, EMAIL_LOCAL, isAlnum, isDigit, isEscapeLetter, wordBefore } from './byte-class.ts';

// pii: email, credit_card (13–19 digits, single spaces or dashes between digits, Luhn-valid, issuer
// digit 2–6), ssn (XXX-XX-XXXX, no area 000/666/9xx, no group 00, no serial 0000). Prefilters keep the
// clean-body cost near memchr: emails are found from their `@`; digit runs are probed every 11 bytes
// (the shortest run of interest is an 11-byte SSN, so every such run holds a probe) and only a probe
// that lands on a digit is expanded and confirmed.

export const id = 'pii';

export interface PiiPlan {
  severity: 'log' | 'warn' | 'block';
  email: boolean;
  creditCard: boolean;
  ssn: boolean;
}

export function compile(toggle: PiiToggle): PiiPlan | null {
  if (!toggle.enabled) return null;
  const all = toggle.types === null;
  return {
    severity: recordedSeverity(toggle.severity),
    email: all || toggle.types!.includes('email'),
    creditCard: all || toggle.types!.includes('credit_card'),
    ssn: all || toggle.types!.includes('ssn'),
  };
}

const AT = 0x40;
const DOT = 0x2e;
const DASH = 0x2d;
const SPACE = 0x20;

const FILE_EXTENSIONS = new Set(['png', 'jpg', 'jpeg', 'gif', 'svg', 'webp', 'ico', 'bmp', 'tif', 'tiff', 'avif', 'heic',
  'css', 'js', 'mjs', 'cjs', 'ts', 'tsx', 'jsx', 'json', 'yaml', 'yml', 'toml', 'txt', 'pdf', 'gz', 'tgz', 'java', 'html', 'htm',
  'xml', 'csv', 'lock', 'log', 'wasm', 'woff', 'woff2', 'ttf', 'otf']);

/** The email around the `@` at `at`, or null. */
export function emailAt(view: Buffer, at: number): string | null {
  let start = at;
  while (start > 0 && CLASS[view[start - 1]] & EMAIL_LOCAL) start--;
  // In a body scanned as sent, `\nbob@…` starts at `b`: the `n` belongs to the escape.
  if (start < at && isEscapeLetter(view, start)) start++;
  while (start < at && (view[start] === DOT || view[start] === DASH)) start++;
  if (start === at) return null;
  let end = at + 1;
  while (end < view.length && CLASS[view[end]] & EMAIL_DOMAIN) end++;
  while (end > at + 1 && (view[end - 1] === DOT || view[end - 1] === DASH)) end--;
  // The domain: labels of [A-Za-z0-9-], no empty label, a last label of 2+ letters.
  const domain = view.subarray(at + 1, end);
  if (domain.length < 4 || domain[0] === DOT || domain[0] === DASH) return null;
  const lastDot = domain.lastIndexOf(DOT);
  if (lastDot < 1 || domain.length - lastDot - 1 < 2) return null;
  for (let i = lastDot + 1; i < domain.length; i++) if (!(CLASS[domain[i]] & ALPHA)) return null;
  if (domain.indexOf('..') >= 0) return null;
  // `icon@2x.png`, `pkg@1.2.tgz`: a file name, not an address (none of these is a top-level domain).
  if (FILE_EXTENSIONS.has(domain.toString('latin1', lastDot + 1).toLowerCase())) return null;
  return view.toString('latin1', start, end);
}

export function luhnValid(digits: string): boolean {
  let sum = 0;
  let double = false;
  for (let i = digits.length - 1; i >= 0; i--) {
    let d = digits.charCodeAt(i) - 48;
    if (double) {
      d *= 2;
      if (d > 9) d -= 9;
    }
    sum += d;
    double = !double;
  }
  return sum % 10 === 0;
}

/** A plausible card number: 13–19 digits, issuer (major industry) digit 2–6, Luhn-valid. */
export function isCardNumber(digits: string): boolean {
  if (digits.length < 13 || digits.length > 19) return false;
  const first = digits.charCodeAt(0) - 48;
  if (first < 2 || first > 6) return false;
  return luhnValid(digits);
}

export function isSsn(text: string): boolean {
  if (!/^\d{3}-\d{2}-\d{4}$/.test(text)) return false;
  const area = Number(text.slice(0, 3));
  if (area === 0 || area === 666 || area >= 900) return false;
  if (text.slice(4, 6) === '00' || text.slice(7) === '0000') return false;
  return true;
}

/**
 * Card numbers in a maximal run of digit groups joined by single spaces or dashes. Cards are written
 * whole or in groups ("4111 1111 1111 1111"); a run longer than a card (a card next to another number)
 * is tried as windows of consecutive groups, keeping the text as written.
 */
function cardsInRun(run: string): string[] {
  const groups = [...run.matchAll(/\d+/g)].map((m) => ({ at: m.index, end: m.index + m[0].length, digits: m[0] }));
  const found: string[] = [];
  for (let i = 0; i < groups.length; i++) {
    let digits = '';
    for (let j = i; j < groups.length; j++) {
      // Cards are grouped in fours to sixes (4-4-4-4, 4-6-5) with a shorter last group: a list of
      // small numbers (`2 3 5 7 11 13 …`) is no card, though one window in ten passes Luhn.
      if (j > i && (groups[j - 1].digits.length < 4 || groups[j - 1].digits.length > 6)) break;
      digits += groups[j].digits;
      if (digits.length > 19) break;
      if (digits.length >= 13 && isCardNumber(digits)) {
        found.push(run.slice(groups[i].at, groups[j].end));
        i = j;
        break;
      }
    }
  }
  return found;
}

function isSeparator(b: number | undefined): boolean {
  return b === SPACE || b === DASH;
}

export function scan(view: Buffer, plan: PiiPlan, location: FindingLocation): Finding[] {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const add = (description: string, value: string) => {
    if (seen.has(value) || findings.length >= MAX_FINDINGS_PER_INSPECTOR) return;
    seen.add(value);
    findings.push({ inspector_type: id, severity: plan.severity, description, match: redact(value), location });
  };

  if (plan.email) {
    for (let at = view.indexOf(AT); at >= 0; at = view.indexOf(AT, at + 1)) {
      const email = emailAt(view, at);
      if (email !== null) add('email address', email);
    }
  }

  if (plan.creditCard || plan.ssn) {
    const n = view.length;
    const STRIDE = 11;
    for (let probe = STRIDE - 1; probe < n; probe += STRIDE) {
      const b = view[probe];
      if (!isDigit(b) && !(isSeparator(b) && isDigit(view[probe - 1]) && isDigit(view[probe + 1]))) continue;
      // Expand to the maximal run of digits joined by single separators.
      let start = probe;
      while (start > 0 && (isDigit(view[start - 1]) || (isSeparator(view[start - 1]) && isDigit(view[start - 2]) && isDigit(view[start])))) start--;
      let end = probe + 1;
      while (end < n && (isDigit(view[end]) || (isSeparator(view[end]) && isDigit(view[end + 1]) && isDigit(view[end - 1])))) end++;
      while (probe + STRIDE < end) probe += STRIDE;
      if (end - start < STRIDE) continue;
      // A run glued to letters or digits is part of an identifier or hash, not a number on its own.
      if (wordBefore(view, start) || isAlnum(view[end])) continue;
      const run = view.toString('latin1', start, end);
      if (plan.ssn) for (const part of run.split(' ')) if (part.length === 11 && isSsn(part)) add('US social security number', part);
      if (plan.creditCard) for (const card of cardsInRun(run)) add('credit card number', card);
    }
  }
  return findings;
}
