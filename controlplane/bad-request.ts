import { ApiError, PROBLEMS } from './errors.ts';

// The 400 of a request whose shape its route's JSON schema accepted but whose values are wrong: the detail
// starts with the field it is about, like a schema refusal ("name: must be 1–63 lowercase letters").

export function bad(field: string, message: string): never {
  throw new ApiError(PROBLEMS.badRequest, `${field}: ${message}`);
}

const LOOPBACK = ['127.0.0.1', 'localhost', '[::1]'];

/** An absolute https URL (or http on loopback only); absent and empty are left alone. */
export function httpsUrl(field: string, value: string | null | undefined): string | undefined {
  if (value === undefined || value === null || value === '') return value ?? undefined;
  let u: URL;
  try {
    u = new URL(value);
  } catch {
    bad(field, 'must be an absolute URL');
  }
  if (u.protocol !== 'https:' && !(u.protocol === 'http:' && LOOPBACK.includes(u.hostname)))
    bad(field, 'must be https');
  return value;
}
