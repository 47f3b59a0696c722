import fc from 'fast-check';
import t from 'tap';
import { compile } from '../../pipeline/inspectors/patterns.ts';
import { type NormalizedView, normalizedView } from '../../pipeline/normalized-view.ts';
import { changedWindows, JUNCTION, windowReach } from '../../pipeline/normalized-windows.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { findingKey, scanBody, type ScanResult } from '../../pipeline/scan.ts';

// The normalized stage reads only windows of the view around what normalization changed
// (pipeline/normalized-windows.ts): the view must tell every place it changed, and a scan reading the
// windows must find what a scan reading the whole view finds.

/** Outside its changes the view is the input byte for byte, in order (changes told or not). */
function honest(input: Buffer, v: NormalizedView): boolean {
  const changes = v.changes;
  if (changes === null) return true;
  let view = 0;
  let at = 0;
  for (let k = 0; k < changes.length; k += 4) {
    const [viewStart, viewEnd, inputStart, inputEnd] = changes.slice(k, k + 4);
    if (viewStart < view || inputStart < at || viewEnd < viewStart || inputEnd < inputStart) return false;
    if (!v.bytes.subarray(view, viewStart).equals(input.subarray(at, inputStart))) return false;
    view = viewEnd;
    at = inputEnd;
  }
  return v.bytes.subarray(view).equals(input.subarray(at)) && view <= v.bytes.length && at <= input.length;
}

t.test('a view tells where it changed', async (t) => {
  const cases: [string, number[]][] = [
    // a dropped character is an empty span of the view
    ['ab\u200bcd', [2, 2, 2, 5]],
    ['a…b', [1, 4, 1, 4]],
    ['x&#64;y', [1, 2, 1, 6]],
    ['\u200bab\u200b', [0, 0, 0, 3, 2, 2, 5, 8]],
    // a mark on ASCII is dropped; a pair that composes rewrites its starter (the view is cut back)
    ['abe\u0301z', [3, 3, 3, 5]],
    ['xα\u0301y', [1, 3, 1, 5]],
    // ANSI colour: the whole sequence
    ['k\u001b[31mEY', [1, 1, 1, 6]],
  ];
  for (const [text, changes] of cases) {
    const v = normalizedView(Buffer.from(text))!;
    t.same(v.changes, changes, JSON.stringify(text));
    t.ok(honest(Buffer.from(text), v), `${JSON.stringify(text)}: the rest is the input`);
  }
  // Two entity levels: not told (the next level walks the first one's view).
  t.equal(normalizedView(Buffer.from('a&amp;#64;b'))!.changes, null, 'a second level changed something: not told');
  t.same(normalizedView(Buffer.from('Tom &amp; Jerry'))!.changes, [4, 5, 4, 9], 'a second level that changes nothing');
  // Past MAX_SPANS places: not told.
  t.equal(normalizedView(Buffer.from('a\u200b'.repeat(5000)))!.changes, null, 'past the bound: not told');
  t.ok(normalizedView(Buffer.from('a\u200b'.repeat(4000)))!.changes, 'below the bound: told');
});

t.test('property: outside its changes the view is its input, and one level is always told', async () => {
  const unit = fc.constantFrom(
    'a',
    'Z',
    '1',
    ' ',
    ',',
    '\n',
    'lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor ',
    'é',
    'e\u0301',
    'ø\u0301',
    'α\u0301',
    'α\u0316\u0301',
    'α\u0301\u0316',
    '日\u0301\u0316',
    '\u0301',
    '\u0316',
    'か\u3099',
    'ｶﾞ',
    '각',
    '\u1100\u1161\u11a8',
    '\u1112',
    '\u11c2',
    'ᾀ\u0316',
    'Ａ',
    '４',
    '＠',
    '…',
    '\u00a0',
    '\u2013',
    'ﬁ',
    '𝐀',
    '\ufdfa',
    '\u200b',
    '\u00ad',
    '\u0085',
    '\u009f',
    '\u0000',
    '\u007f',
    '\u001b[01;31m',
    '\u001b[K',
    '\u001bX',
    '\b',
    'Q\bA',
    '&#8;',
    '&#64;',
    '&#x200b;',
    '&commat;',
    '&lt;',
    '&',
    '&#',
    '✓',
    '😀',
    '👨\u200d👩',
    'ཀ\u0f77',
    '\u0e48',
  );
  const invalid = fc.constant(Buffer.from([0xff]));
  fc.assert(
    fc.property(
      fc.array(
        fc.oneof(
          unit.map((u) => Buffer.from(u)),
          invalid,
        ),
        { maxLength: 40 },
      ),
      (units) => {
        const input = Buffer.concat(units);
        const v = normalizedView(input);
        if (v === null) return true;
        if (!honest(input, v) || v.bytes.length > 2 * input.length) return false;
        // No `&` (the only way to a second level): the changes are told.
        return v.changes !== null || input.includes('&');
      },
    ),
    { numRuns: 20_000 },
  );
});

t.test('windows: around each change, cut after a separator, joined by 0xFF', async (t) => {
  const filler = (n: number) => 'lorem ipsum, dolor sit amet: '.repeat(n);
  const text = `${filler(40)}xx\u200byy${filler(40)}zz\u200bqq${filler(40)}`;
  const v = normalizedView(Buffer.from(text))!;
  t.equal(v.changes!.length, 8, 'two changes');
  const w = changedWindows(v.bytes, v.changes!, 10)!;
  const parts = w.toString('latin1').split(String.fromCharCode(JUNCTION));
  t.equal(parts.length, 2, 'two windows');
  for (const part of parts) {
    t.ok(v.bytes.toString('latin1').includes(part), 'a window is bytes of the view');
    t.match(part, /^ (?:dolor|lorem)/, 'it starts after a separator');
    t.match(part, /[,:]$/, 'it ends on one');
  }
  t.match(parts[0], /xxyy/, 'the first change is in the first window');
  t.match(parts[1], /zzqq/, 'the second in the second');
  t.ok(
    parts[0].indexOf('xxyy') >= 12 && parts[0].length - parts[0].indexOf('xxyy') >= 4 + 12,
    'reach and 2 either side',
  );
  // Close changes share a window; windows covering more than half the view give it whole.
  const close = normalizedView(Buffer.from(`${filler(40)}a\u200bb c\u200bd${filler(40)}`))!;
  t.equal(changedWindows(close.bytes, close.changes!, 10)!.indexOf(JUNCTION), -1, 'one window');
  t.equal(changedWindows(v.bytes, v.changes!, 2000), null, 'more than half: null');
  t.equal(changedWindows(v.bytes, [], 10), null, 'no change told: null');
  // No separator around the change: the window runs to the view's ends.
  const bare = normalizedView(Buffer.from(`${'a'.repeat(300)}\u200b${'b'.repeat(300)}`))!;
  t.equal(changedWindows(bare.bytes, bare.changes!, 10), null, 'no separator: the whole view');
});

t.test('how far the windows reach, and when the whole view is read', async (t) => {
  const plan = (...patterns: string[]) =>
    compile(patterns.map((pattern) => ({ pattern, description: '', severity: 'warn' as const })));
  t.equal(windowReach(null, []), 0, 'built-ins alone: the separators bound them');
  t.equal(windowReach(plan('INC-[0-9]{6}'), []), 0, 'a pattern no match of which holds a separator');
  t.equal(
    windowReach(plan('ticket:[0-9]{4}'), []),
    4 * 'ticket:[0-9]{4}'.length * 4,
    'a bounded pattern: its longest match',
  );
  t.equal(
    windowReach(plan('(?i)confidential[: ]+internal'), []),
    12 * 4,
    'an unbounded one with a literal: the literal',
  );
  t.equal(windowReach(plan('\\S{6,}'), []), null, 'unbounded, no literal: the whole view');
  t.equal(windowReach(plan('^INC$'), []), 3, 'one that reads around it, with a literal: the literal');
  t.equal(windowReach(plan('a\\Cb'), []), null, '\\C matches the byte between two windows: the whole view');
  t.equal(windowReach(null, ['hunter2,hunter2']), 3 * 6 * 15, 'a secret: three times its escaped length');
  t.equal(windowReach(null, ['x'.repeat(20_000)]), null, 'a secret too long: the whole view');
  t.equal(windowReach(null, ['pass\ufffdword']), null, 'a secret holding U+FFFD: the whole view');
});

// ---------- a scan reading windows against one reading the whole view ----------

const PATTERNS = [
  { pattern: 'ticket:[0-9]{4}', description: 'ticket', severity: 'warn' },
  { pattern: '\\bINC-[0-9]{6}\\b', description: 'incident', severity: 'block' },
  { pattern: '(?i)confidential[: ]+internal', description: 'marking', severity: 'warn' },
  { pattern: '(?i)\\bpassword\\s*[:=]\\s*\\S{6,}', description: 'password', severity: 'warn' },
  { pattern: '\\btok_[a-z0-9]+', description: 'token', severity: 'warn' },
  { pattern: '[a-z: ]+@internal\\.corp', description: 'mailbox', severity: 'log' },
];
const policy = policyFromDocument(
  validatePolicyDocument({
    content_inspection: {
      secrets_filter: { enabled: true },
      pii_detection: { enabled: true },
      api_key_detection: { enabled: true, severity: 'block' },
      patterns: PATTERNS,
    },
  }),
);
const plan = compilePlan(policy);
const SECRETS = ['hunter2,hunter2', 'zebra:crossing-42'];

const keys = (r: ScanResult) => r.findings.map(findingKey).sort();
/**
 * What decides: each inspector and custom pattern that fired, at its severity, with the built-ins'
 * and the secrets' matches. A custom pattern's match may differ in its place: a window opening inside
 * a match the whole view's run took (the run from its start reports the match starting there, which
 * the whole run stepped over) reports that one too (docs/decisions.md).
 */
const decided = (r: ScanResult) =>
  [
    ...new Set(
      r.findings.map((f) => (f.inspector_type === 'patterns' ? `${f.description}\u0000${f.severity}` : findingKey(f))),
    ),
  ].sort();
const scanned = (body: Buffer, wholeNormalized: boolean) =>
  scanBody(plan, { body, phase: 'request', secrets: SECRETS, wholeNormalized });

// Leaks written plainly and split or spelled by what normalization changes, changes alone, and filler
// long enough that the windows cover less than half a body.
const FILLER = 'lorem ipsum dolor sit amet, consectetur adipiscing elit: sed do eiusmod tempor. '.repeat(8);
const FRAGMENTS = [
  FILLER,
  'lorem ipsum ',
  ' ',
  ', ',
  ': ',
  '\\n',
  '…',
  '\u00a0',
  '\u200b',
  '\\u200b',
  '&#8203;',
  'é',
  '✓',
  'AKIAIOSFODNN7EXAMPLE ',
  'AKIA\u200bIOSFODNN7EXAMPLF ',
  'AKIAIOSFODNN7EXAMPL\u200b',
  'sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0',
  'alice',
  '@',
  '＠',
  '&#64;',
  'example.org ',
  '4111 1111 1111 1111 ',
  '４111 1111 1111 1111 ',
  '123-45-6789',
  '123\u200b-45-6789',
  'hunter2,hunter2 ',
  'hunter2,\u200bhunter2 ',
  'zebra:cross\u00adi',
  'ng-42 ',
  'ticket:',
  '1234',
  '\u200b5678',
  'INC-123456 ',
  'INC\u2013654321 ',
  'confidential',
  'CONFIDENTIAL: ',
  'inter\u200bnal',
  'internal ',
  ' '.repeat(300),
  'password',
  '=',
  ' hunter\u200b22222',
  'x'.repeat(400),
  'tok_',
  'abc\u200bdef ',
  'ab cd ef ',
  '@internal.corp ',
  'Q\\b',
  '&#8;',
];

function bodyOf(messages: number[][]): Buffer {
  const parts = messages.map((m) => `{"role":"user","content":"${m.map((i) => FRAGMENTS[i]).join('')}"}`);
  return Buffer.from(`{"model":"claude-sonnet-4-5","messages":[${parts.join(',')}]}`);
}

t.test('property: reading the windows finds what reading the whole view finds', async (t) => {
  let windowed = 0;
  let differ = 0;
  const fragment = fc.oneof(
    { arbitrary: fc.constant(0), weight: 2 },
    { arbitrary: fc.integer({ min: 1, max: FRAGMENTS.length - 1 }), weight: 5 },
  );
  fc.assert(
    fc.property(
      fc.array(fc.array(fragment, { minLength: 1, maxLength: 30 }), { minLength: 1, maxLength: 8 }),
      (messages) => {
        const body = bodyOf(messages);
        const whole = scanned(body, true);
        const windows = scanned(body, false);
        const v = normalizedView(
          Buffer.from(body.toString('utf8').replaceAll('\\u200b', '\u200b').replaceAll('\\n', '\n')),
        );
        if (v?.changes && changedWindows(v.bytes, v.changes, 200)) windowed++;
        t.same(windows.failures, whole.failures);
        if (JSON.stringify(keys(windows)) !== JSON.stringify(keys(whole))) differ++;
        return JSON.stringify(decided(windows)) === JSON.stringify(decided(whole));
      },
    ),
    { numRuns: 1500 },
  );
  t.ok(windowed > 300, `bodies whose stage read windows: ${windowed}`);
  t.ok(differ < 30, `bodies where a custom pattern's match differs in its place: ${differ}`);
});

t.test('a change far from a leak, and a leak made by a change far from its literal', async (t) => {
  const filler = 'lorem ipsum dolor sit amet, consectetur adipiscing elit: sed do eiusmod tempor. '.repeat(2000);
  const body = (text: string) =>
    Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: text }] }));
  const cases: [string, string, string][] = [
    // one ellipsis at the start, a key split by a zero-width space 160 KB on
    ['a key far from the other change', `wait… ${filler} AKIA\u200bIOSFODNN7EXAMPLE ${filler}`, 'api_key'],
    ['an address spelled with a full-width at', `… ${filler} bob＠example.com ${filler}`, 'pii'],
    // the marking's literal 3,000 spaces before the change that completes it: only the whole view has
    // both, and the literal is in the decoded view
    [
      'an unbounded match whose literal is far from its change',
      `… ${filler} confidential:${' '.repeat(3000)}inter\u200bnal ${filler}`,
      'patterns',
    ],
    ['a literal a change makes', `… ${filler} confi\u200bdential internal ${filler}`, 'patterns'],
    // 150,000 spaces between: the walk back from the change is past its budget, and one set pass over
    // the whole view names the pattern instead
    [
      'an unbounded match past the walk budget',
      `… ${filler} confidential:${' '.repeat(150_000)}inter\u200bnal ${filler}`,
      'patterns',
    ],
    // the change 3,000 bytes before the mailbox's literal, in a prefix that runs on to it
    [
      'an unbounded match whose change is far before its literal',
      `… ${filler} xy\u200bzw ${'ab '.repeat(1000)}@internal.corp ${filler}`,
      'patterns',
    ],
    ['a secret split by a soft hyphen', `… ${filler} zebra:cross\u00ading-42 ${filler}`, 'secrets'],
  ];
  for (const [name, text, inspector] of cases) {
    const b = body(text);
    const whole = scanned(b, true);
    const windows = scanned(b, false);
    t.same(keys(windows), keys(whole), `${name}: as the whole view`);
    t.ok(
      windows.findings.some((f) => f.inspector_type === inspector),
      `${name}: found (${inspector})`,
    );
  }
  // A window cut where its reach ends, not after a separator, would start on `AKIA` inside a longer
  // word: a key that is not there.
  const margin = windowReach(policy.content!.patterns.length ? compile(policy.content!.patterns) : null, SECRETS)! + 2;
  const inside = body(`… ${filler} ${'q'.repeat(500)}AKIAIOSFODNN7EXAMPLE ${'z'.repeat(margin - 21)}\u200b ${filler}`);
  const found = scanned(inside, false);
  t.same(
    keys(found),
    keys(scanned(inside, true)),
    "a key inside a word, a window's reach from a change: as the whole view",
  );
  t.notOk(
    found.findings.some((f) => f.inspector_type === 'api_key'),
    'no key where a window would have cut the word',
  );
  // Two windows, the first ending just after `hunter2,`, the second starting at `hunter2`: read together
  // they would spell the secret `hunter2,hunter2`, which is nowhere in the body.
  const apart = body(
    `… ${filler} \u200b${'y'.repeat(margin)}hunter2,${filler},hunter2${'z'.repeat(margin)}\u200b ${filler}`,
  );
  const windowed = scanned(apart, false);
  t.same(
    keys(windowed),
    keys(scanned(apart, true)),
    'the end of a window and the start of the next: as the whole view',
  );
  t.notOk(
    windowed.findings.some((f) => f.inspector_type === 'secrets'),
    'no secret across the byte between two windows',
  );
});
