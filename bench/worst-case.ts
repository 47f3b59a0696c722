// The worst case of each built-in inspector (padding must not turn fail-open into a bypass): a
// body that fills megabytes with what that inspector has to look at hardest and still find nothing
// in (near-miss card and SSN runs, `@` floods, key-prefix floods, backslash and `\u` floods, a secret
// one character short, a repeated custom-pattern match, SSE lines that are not JSON), followed by one
// real hit, which must still be found. The pipeline benchmark reports MB/s on each; the tests check
// each terminates with the right result (test/pipeline/worst-case.test.ts).

export const WORST_SECRET = 'hunter2-agent-secret-value';

export const WORST_PATTERNS = [
  { pattern: '\\bINC-[0-9]{6}\\b', description: 'incident id', severity: 'log' },
  { pattern: '(?i)project[- ]nightingale', description: 'codename', severity: 'block' },
  { pattern: '\\bacct_[0-9]{8,12}\\b', description: 'account id', severity: 'warn' },
];

export interface WorstCase {
  /** The inspector whose worst case this is (the plan the benchmark runs it under). */
  inspector: 'pii' | 'api_key' | 'secrets' | 'patterns';
  name: string;
  phase: 'request' | 'response';
  /** What is repeated, and the real hit after it. */
  unit: string;
  tail: string;
  /** The findings the scan must report (`inspector_type:match`, sorted). */
  expect: string[];
  /** Raw bytes, not a JSON string (SSE streams). */
  raw?: boolean;
  /** The failures the scan must report (`inspector:reason`). */
  failures?: string[];
}

export const WORST_CASES: readonly WorstCase[] = [
  {
    inspector: 'pii',
    name: 'card near misses (4111 1111 1111 111 …)',
    phase: 'request',
    unit: '4111 1111 1111 111 ',
    tail: ' x card 4111 1111 1111 1111 x',
    expect: ['pii:4111****'],
  },
  {
    inspector: 'pii',
    name: 'card-like dash groups (4111-1111-1111-111-…)',
    phase: 'request',
    unit: '4111-1111-1111-111-',
    tail: ' x card 4111-1111-1111-1111 x',
    expect: ['pii:4111****'],
  },
  {
    inspector: 'pii',
    name: 'SSN near misses (123-45-678 …)',
    phase: 'request',
    unit: '123-45-678 ',
    tail: ' x ssn 123-45-6789 x',
    expect: ['pii:123-****'],
  },
  {
    inspector: 'pii',
    name: '`@` flood (a@a@a@…)',
    phase: 'request',
    unit: 'a@',
    tail: ' mail jane@example.com',
    expect: ['pii:jane****'],
  },
  {
    inspector: 'pii',
    name: 'long local part, no domain (aaaa…@ …)',
    phase: 'request',
    unit: 'a'.repeat(250) + '@ ',
    tail: ' mail jane@example.com',
    expect: ['pii:jane****'],
  },
  {
    inspector: 'api_key',
    name: 'AKIA flood (AKIAAKIA…)',
    phase: 'request',
    unit: 'AKIA',
    tail: ' key AKIAIOSFODNN7EXAMPLE',
    expect: ['api_key:AKIA****'],
  },
  {
    inspector: 'api_key',
    name: 'sk- flood (sk-sk-sk-…)',
    phase: 'request',
    unit: 'sk-',
    tail: ' key sk-proj-AbCdEfGhIjKlMnOpQrSt1234567890',
    expect: ['api_key:sk-p****'],
  },
  {
    inspector: 'api_key',
    name: 'ghp_ flood (ghp_ghp_…)',
    phase: 'request',
    unit: 'ghp_',
    tail: ' key ghp_' + 'aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5',
    expect: ['api_key:ghp_****'],
  },
  {
    inspector: 'api_key',
    name: '`_` and `-` flood (_-_-…)',
    phase: 'request',
    unit: '_-',
    tail: ' key AKIAIOSFODNN7EXAMPLE',
    expect: ['api_key:AKIA****'],
  },
  {
    inspector: 'api_key',
    name: 'decoded view: `\\u` flood (no hex digits)',
    phase: 'request',
    unit: '\\u',
    tail: ' key \\u0041KIAIOSFODNN7EXAMPLE',
    expect: ['api_key:AKIA****'],
  },
  {
    inspector: 'api_key',
    name: 'decoded view: backslash flood (\\\\\\\\…)',
    phase: 'request',
    unit: '\\\\',
    tail: ' key \\u0041KIAIOSFODNN7EXAMPLE',
    expect: ['api_key:AKIA****'],
  },
  {
    inspector: 'api_key',
    name: 'decoded view: every byte escaped (\\u0041…)',
    phase: 'request',
    unit: '\\u0041',
    tail: ' key \\u0041KIAIOSFODNN7EXAMPLE',
    expect: ['api_key:AKIA****'],
  },
  {
    inspector: 'secrets',
    name: 'secret near misses (one character short)',
    phase: 'request',
    unit: WORST_SECRET.slice(0, -1) + ' ',
    tail: ' pw ' + WORST_SECRET,
    expect: ['secrets:hunt****'],
  },
  {
    inspector: 'patterns',
    name: 'one match repeated (INC-123456 …)',
    phase: 'request',
    unit: 'INC-123456 ',
    tail: ' Project Nightingale',
    expect: ['patterns:INC-****', 'patterns:Proj****'],
  },
  // A stream of lines JSON.parse refuses (microseconds each): past MAX_BAD_LINES the joined delta
  // text is given up on, and said so; the stream as sent is still scanned.
  {
    inspector: 'secrets',
    name: 'SSE lines that are not JSON (data: {"delta"}…)',
    phase: 'response',
    unit: 'data: {"delta"}\n',
    tail: `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"${WORST_SECRET}"}}\n`,
    expect: ['secrets:hunt****'],
    raw: true,
    failures: ['sse_text:unparsable_lines'],
  },
];

/** The case's body, about `size` bytes: the unit repeated, then the tail, inside a request's JSON (or raw). */
export function worstBody(c: WorstCase, size: number): Buffer {
  const repeat = Math.max(1, Math.floor(size / Buffer.byteLength(c.unit)));
  if (c.raw) return Buffer.concat([Buffer.alloc(repeat * Buffer.byteLength(c.unit), c.unit), Buffer.from(c.tail)]);
  // The content is written into the JSON as is: the unit's backslashes are the body's escapes.
  const head = Buffer.from('{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"');
  const end = Buffer.from(c.tail + '"}]}');
  return Buffer.concat([head, Buffer.alloc(repeat * Buffer.byteLength(c.unit), c.unit), end]);
}

/** Every inspector's worst case in one body (the end-to-end engine run): each part `size / n` bytes. */
export function combinedWorstBody(size: number): Buffer {
  const parts = WORST_CASES.filter((c) => !c.raw);
  const per = Math.floor(size / parts.length) - 64;
  const content = parts.map((c) => {
    const body = worstBody(c, per);
    // Only the content of each case: its unit run and tail, between the JSON head and end.
    return body.subarray(body.indexOf('"content":"') + 11, body.length - 4);
  });
  return Buffer.concat([
    Buffer.from('{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"'),
    ...content.flatMap((c) => [c, Buffer.from(' ')]),
    Buffer.from('"}]}'),
  ]);
}
