import { redact } from '../finding.ts';
import { type ApiKeyPlan, scan as scanApiKeys } from '../inspectors/api-key.ts';
import { type PiiPlan, scan as scanPii } from '../inspectors/pii.ts';
import { MIN_SECRET_LENGTH } from '../inspectors/secrets.ts';
import { MAX_ARGUMENT_DEPTH, nestingDepth } from './arguments.ts';

// A tool call's arguments as they are stored and shown (the decision's record, an approval's view):
// every value the built-in detectors find replaced by its first 4 characters + `****`, like a finding's
// match (pipeline/finding.ts), then capped (docs/tool-policy.md, "Redacted arguments").
//
//   detectors   the agent's secrets (≥ 8 characters, any letter case, raw or JSON-escaped), API keys
//               (inspectors/api-key.ts), PII: email, card number (Luhn), SSN (inspectors/pii.ts)
//   read in     the text as sent, and, when it parses, every string in it decoded (keys too): an escape
//               (`\u0040`) hides nothing
//   written as  the text as sent with each value (and its JSON-escaped form) replaced; when a value
//               survives that (one written with escapes), the parsed arguments re-serialized with each
//               string redacted
//   capped at   MAX_STORED_ARGUMENT_BYTES of UTF-8, cut on a character, with a marker saying so
//
// The normalized view (invisible characters, homoglyphs) of the inspection pipeline is not applied
// here: the stored text is for people, and the call itself went through whatever inspection applies.

/** The stored arguments' bound, in UTF-8 bytes, marker included. */
export const MAX_STORED_ARGUMENT_BYTES = 16 * 1024;

const PII: PiiPlan = { severity: 'log', email: true, creditCard: true, ssn: true };
const API_KEYS: ApiKeyPlan = { severity: 'log' };

export function redactArguments(text: string, secrets: readonly string[]): string {
  const needles = secretNeedles(secrets);
  const values = new Set<string>();
  detect(Buffer.from(text, 'utf8'), values);
  const parsed = parse(text);
  if (parsed.ok) detect(Buffer.from(strings(parsed.value).join('\n'), 'utf8'), values);
  let out = replaceAll(text, values, needles, parsed.ok);
  if (parsed.ok && leaks(out, needles)) {
    out = JSON.stringify(mapStrings(parsed.value, (s) => replaceAll(s, values, needles, false)));
  }
  return cap(out);
}

interface SecretNeedle {
  redacted: string;
  pattern: RegExp;
}

function secretNeedles(secrets: readonly string[]): SecretNeedle[] {
  const out: SecretNeedle[] = [];
  const seen = new Set<string>();
  // Longest first: a secret holding another is replaced whole.
  for (const s of [...secrets].sort((a, b) => b.length - a.length)) {
    if (typeof s !== 'string' || [...s].length < MIN_SECRET_LENGTH || seen.has(s)) continue;
    seen.add(s);
    const forms = [...new Set([s, JSON.stringify(s).slice(1, -1)])].map(escapeRegExp);
    out.push({ redacted: redact(s), pattern: new RegExp(forms.join('|'), 'giu') });
  }
  return out;
}

function escapeRegExp(s: string): string {
  return s.replace(/[\\^$.*+?()[\]{}|/]/g, '\\$&');
}

/** Adds the API keys and PII values found in `view` to `values`. */
function detect(view: Buffer, values: Set<string>): void {
  const add = (latin1: string) => values.add(Buffer.from(latin1, 'latin1').toString('utf8'));
  scanApiKeys(view, API_KEYS, 'request_body', add);
  scanPii(view, PII, 'request_body', add);
}

/** Each value (longest first) and, in JSON text, its escaped form, then each secret, replaced. */
function replaceAll(text: string, values: Set<string>, needles: readonly SecretNeedle[], json: boolean): string {
  // In JSON text the replacement lands inside a string: written escaped, it keeps the text JSON.
  const written = (redacted: string) => (json ? JSON.stringify(redacted).slice(1, -1) : redacted);
  let out = text;
  for (const needle of needles) out = out.replace(needle.pattern, () => written(needle.redacted));
  for (const value of [...values].sort((a, b) => b.length - a.length)) {
    const redacted = written(redact(value));
    out = out.split(value).join(redacted);
    if (json) {
      const escaped = JSON.stringify(value).slice(1, -1);
      if (escaped !== value) out = out.split(escaped).join(redacted);
    }
  }
  return out;
}

/** Whether the redacted JSON text still holds a detected value once its strings are decoded. */
function leaks(out: string, needles: readonly SecretNeedle[]): boolean {
  const again = parse(out);
  if (!again.ok) return true;
  const decoded = strings(again.value).join('\n');
  const found = new Set<string>();
  detect(Buffer.from(decoded, 'utf8'), found);
  if (found.size > 0) return true;
  return needles.some((n) => {
    n.pattern.lastIndex = 0;
    return n.pattern.test(decoded);
  });
}

function parse(text: string): { ok: true; value: unknown } | { ok: false } {
  if (nestingDepth(text) > MAX_ARGUMENT_DEPTH) return { ok: false };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

/** Every string of a parsed value, object keys included (depth already bounded). */
function strings(value: unknown, out: string[] = []): string[] {
  if (typeof value === 'string') out.push(value);
  else if (Array.isArray(value)) for (const v of value) strings(v, out);
  else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      out.push(k);
      strings(v, out);
    }
  }
  return out;
}

/** The parsed value with every string (keys too) mapped; objects without a prototype keep `__proto__` a key. */
function mapStrings(value: unknown, f: (s: string) => string): unknown {
  if (typeof value === 'string') return f(value);
  if (Array.isArray(value)) return value.map((v) => mapStrings(v, f));
  if (value !== null && typeof value === 'object') {
    const out = Object.create(null) as Record<string, unknown>;
    for (const [k, v] of Object.entries(value)) out[f(k)] = mapStrings(v, f);
    return out;
  }
  return value;
}

const TRUNCATED = (bytes: number) => `…[dvx: truncated, ${bytes} bytes in all]`;

/** At most MAX_STORED_ARGUMENT_BYTES of UTF-8, cut on a character boundary, marked when cut. */
function cap(text: string): string {
  if (text.length * 3 <= MAX_STORED_ARGUMENT_BYTES) return text;
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= MAX_STORED_ARGUMENT_BYTES) return text;
  const marker = TRUNCATED(bytes.length);
  let end = MAX_STORED_ARGUMENT_BYTES - Buffer.byteLength(marker, 'utf8');
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--;
  return bytes.toString('utf8', 0, end) + marker;
}
