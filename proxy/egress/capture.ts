import { scan as scanApiKeys } from '../../pipeline/inspectors/api-key.ts';
import { MIN_SECRET_LENGTH } from '../../pipeline/inspectors/secrets.ts';
import { hostMatch } from './host-match.ts';
import type { GatewayOptions } from './options.ts';

// What a terminated request leaves in its `network_flow` record (docs/gateway.md, "Interception and
// capture"): the first --http-capture-max-body bytes of each body as UTF-8 text, and the headers, with
// what must never be stored taken out.
//
//   headers  authorization, proxy-authorization, cookie, set-cookie, x-api-key and every header the
//            gateway set itself (an injected credential, a route's identity header) are left out
//   values   the agent's secrets, the credentials the gateway added, and API keys (the api_key
//            inspector's shapes) are replaced by [REDACTED], in the text as sent, JSON-escaped and
//            percent-encoded, in any letter case
//   bodies   a body is kept to its limit plus CAPTURE_LOOKAHEAD bytes and redacted before it is cut to
//            the limit, so a secret straddling the cut is still recognised whole and no prefix of it
//            is stored

export const CAPTURE_LOOKAHEAD = 8 * 1024;
export const REDACTED = '[REDACTED]';

/** Headers never recorded, whatever their value. */
export const SENSITIVE_HEADERS: ReadonlySet<string> = new Set([
  'authorization',
  'proxy-authorization',
  'cookie',
  'set-cookie',
  'x-api-key',
]);

/** Whether requests to `host` are captured: --http-capture on, and the host is no --no-capture-host. */
export function captures(options: Pick<GatewayOptions, 'httpCapture' | 'noCaptureHost'>, host: string): boolean {
  return options.httpCapture && !options.noCaptureHost.some((pattern) => hostMatch(pattern, host));
}

/** The first bytes of a body as it passes, and how many passed. */
export class BodyCapture {
  readonly #limit: number;
  readonly #keep: number;
  readonly #chunks: Buffer[] = [];
  #kept = 0;
  /** Bytes that passed, captured or not. */
  total = 0;

  constructor(limit: number) {
    this.#limit = limit;
    this.#keep = limit + CAPTURE_LOOKAHEAD;
  }

  push(chunk: Buffer): void {
    this.total += chunk.length;
    if (this.#kept >= this.#keep) return;
    const part = chunk.length <= this.#keep - this.#kept ? chunk : chunk.subarray(0, this.#keep - this.#kept);
    // A copy: the chunk's memory may be reused (a pooled read) once the caller is done with it.
    this.#chunks.push(Buffer.from(part));
    this.#kept += part.length;
  }

  /** The bytes kept (the limit and the lookahead). */
  get bytes(): Buffer {
    return Buffer.concat(this.#chunks, this.#kept);
  }

  /** More passed than the limit records. */
  get truncated(): boolean {
    return this.total > this.#limit;
  }
}

function escapeRegExp(s: string): string {
  return s.replace(/[\\^$.*+?()[\]{}|/]/g, '\\$&');
}

/** Replaces `values` (and API keys) in a text by [REDACTED]; values shorter than 8 characters are not secrets. */
export function redactor(values: readonly string[]): (text: string) => string {
  const forms = new Set<string>();
  for (const v of values) {
    if (typeof v !== 'string' || [...v].length < MIN_SECRET_LENGTH) continue;
    forms.add(v);
    forms.add(JSON.stringify(v).slice(1, -1));
    forms.add(encodeURIComponent(v));
  }
  // Longest first: a value holding another is replaced whole.
  const pattern =
    forms.size === 0
      ? null
      : new RegExp(
          [...forms]
            .sort((a, b) => b.length - a.length)
            .map(escapeRegExp)
            .join('|'),
          'giu',
        );
  return (text) => {
    let out = pattern === null ? text : text.replace(pattern, REDACTED);
    const keys = new Set<string>();
    scanApiKeys(Buffer.from(out, 'utf8'), { severity: 'log' }, 'request_body', (key) =>
      keys.add(Buffer.from(key, 'latin1').toString('utf8')),
    );
    for (const key of [...keys].sort((a, b) => b.length - a.length)) out = out.split(key).join(REDACTED);
    return out;
  };
}

/** The text recorded for a captured body: decoded as UTF-8, redacted, then cut to `limit` bytes on a character. */
export function capturedText(bytes: Buffer, limit: number, redact: (text: string) => string): string {
  const text = redact(bytes.toString('utf8'));
  if (text.length * 3 <= limit) return text;
  const encoded = Buffer.from(text, 'utf8');
  if (encoded.length <= limit) return text;
  let end = limit;
  while (end > 0 && (encoded[end] & 0xc0) === 0x80) end--;
  return encoded.toString('utf8', 0, end);
}

/**
 * Headers as recorded: a JSON object of lower-case name → value (repeated headers joined by `, `),
 * without the sensitive ones nor `drop` (the headers the gateway set), values redacted.
 */
export function recordedHeaders(
  flat: readonly string[],
  drop: ReadonlySet<string>,
  redact: (text: string) => string,
): string {
  const out: Record<string, string> = Object.create(null) as Record<string, string>;
  for (let i = 0; i + 1 < flat.length; i += 2) {
    const name = flat[i].toLowerCase();
    if (SENSITIVE_HEADERS.has(name) || drop.has(name)) continue;
    const value = redact(flat[i + 1]);
    out[name] = Object.hasOwn(out, name) ? `${out[name]}, ${value}` : value;
  }
  return JSON.stringify(out);
}
