import { ApiError, PROBLEMS } from './errors.ts';

// Request-body validation shared by the routes: every refusal is a 400 problem whose detail starts
// with the field it is about ("name: is required"), unknown fields are refused rather than ignored.

export function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

/** The body as an object holding only `allowed` fields. */
export function object(raw: unknown, allowed: readonly string[]): Record<string, unknown> {
  if (raw === null || raw === undefined || typeof raw !== 'object' || Array.isArray(raw)) bad('body', 'must be a JSON object');
  for (const k of Object.keys(raw)) if (!allowed.includes(k)) bad(k, 'unknown field');
  return raw as Record<string, unknown>;
}

/** A string field; `required` also refuses an empty or blank string. */
export function text(body: Record<string, unknown>, field: string, required: boolean): string | undefined {
  const v = body[field];
  if (v === undefined || v === null) {
    if (required) bad(field, 'is required');
    return undefined;
  }
  if (typeof v !== 'string') bad(field, 'must be a string');
  if (required && v.trim() === '') bad(field, 'must not be empty');
  return v;
}

export function strings(body: Record<string, unknown>, field: string): string[] | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) bad(field, 'must be an array of strings');
  v.forEach((s, i) => {
    if (typeof s !== 'string' || s === '') bad(`${field}[${i}]`, 'must be a non-empty string');
  });
  return v as string[];
}

export function bool(body: Record<string, unknown>, field: string): boolean | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') bad(field, 'must be a boolean');
  return v;
}

/** An absolute URL (https, or http on loopback only). */
export function url(body: Record<string, unknown>, field: string, required: boolean): string | undefined {
  const v = text(body, field, required);
  if (v === undefined || v === '') return v;
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    bad(field, 'must be an absolute URL');
  }
  if (u.protocol !== 'https:' && !(u.protocol === 'http:' && ['127.0.0.1', 'localhost', '[::1]'].includes(u.hostname))) bad(field, 'must be https');
  return v;
}
