import fc from 'fast-check';
import t from 'tap';
import {
  isEdge,
  mergeResults,
  patternReach,
  planRanges,
  rangesAt,
  secretsReach,
  splitPatterns,
  type ByteRange,
} from '../../pipeline/byte-ranges.ts';
import { carriesJsonEscapes } from '../../pipeline/json-view.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { findingKey, scanBody, type ScanResult } from '../../pipeline/scan.ts';
import { inspectReporting } from '../../pipeline/worker.ts';
import { pickedEdges } from './range-cuts.ts';
import { pooledPolicy } from '../../pipeline/pooled-policy.ts';

// A body split by byte range must find what the whole body's scan finds: the ranges run through the
// worker's own code (inspectReporting), cut at every kind of seam a body can have.

const PATTERNS = [
  { pattern: 'ticket:[0-9]{4}', description: 'ticket', severity: 'warn' },
  { pattern: 'INC-[0-9]{6}', description: 'incident', severity: 'block' },
  { pattern: 'tok_[a-z0-9]+', description: 'token', severity: 'warn' },
];
const policyWith = (patterns: typeof PATTERNS) =>
  policyFromDocument(
    validatePolicyDocument({
      model_policy: { mode: 'blocklist', models: ['gpt-3*'] },
      content_inspection: {
        secrets_filter: { enabled: true },
        pii_detection: { enabled: true },
        api_key_detection: { enabled: true, severity: 'block' },
        patterns,
      },
    }),
  );
const policy = policyWith(PATTERNS);
const plan = compilePlan(policy);
// Without custom patterns the normalized view is built on the literal view, which each range picks
// for itself (raw, or decoded when it holds a `\u`, `\/` or `\\`): both kinds of policy are tried.
const noPatterns = policyWith([]);
const noPatternsPlan = compilePlan(noPatterns);
const SECRETS = ['hunter2,hunter2', 'zebra:crossing-42', 'walrus:tusk-99'];

// Body text as sent (inside JSON strings): leaks written plainly, through JSON escapes (one and two
// levels), HTML entities, full-width forms, invisible characters and combining marks, separators
// inside them (so an edge can fall in their middle), and filler with separators and UTF-8.
const FILLER = 'lorem ipsum dolor sit amet, consectetur adipiscing elit: sed do eiusmod tempor. '.repeat(12);
const FRAGMENTS = [
  FILLER,
  'lorem ipsum dolor sit amet ',
  'a, b: c [d] {e} "f" ',
  '\n',
  'café ☕ 😀 naïve ',
  'e\u0301 A\u0301 ',
  '\u200b'.repeat(40),
  '\\u200b\\u200b\\u200b',
  '\\n\\t\\"quoted\\" ',
  'AKIAIOSFODNN7EXAMPLE ',
  'AKIA\\u0049OSFODNN7EXAMPLF ',
  'AKIAIOSF\\u200bODNN7EXAMPLG ',
  'AKIAIOSF\u200b\u200b\u200bODNN7EXAMPLH ',
  'AKIA\\\\u0049OSFODNN7EXAMPLJ ',
  'sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0 ',
  'alice@example.org ',
  'bob&#64;example.com ',
  'carol\uff20example.net ',
  'dave\\u0040example.io ',
  '4111 1111 1111 1111 ',
  '123-45-6789 ',
  'hunter2,hunter2 ',
  'hunter2,\u200bhunter2 ',
  'zebra:crossing-42 ',
  // Padding no view keeps, longer than the overlap in bytes as sent: the overlap counts view bytes.
  `walrus:t${'\u200b'.repeat(3000)}usk-99 `,
  `walrus:${'\\u200b'.repeat(600)}tusk-99 `,
  `walrus:${'&#0000000000000000000000000000116;'.repeat(1)}usk-99 `,
  'zebra:cross\\u0069ng-42 ',
  'ticket:1234 ',
  'ticket:\u200b5678 ',
  'ticket:&#57;999 ',
  'INC-123456 ',
  'tok_abc123 ',
  `tok_${'q7'.repeat(2000)} `,
  'tok_\\u0061bc\u200bdef ',
  'INC-&#49;23457 ',
  '&amp;#64; &lt;x&gt; ',
  '\\\\"nested\\\\" ',
];

function bodyOf(messages: number[][]): Buffer {
  const parts = messages.map((m) => `{"role":"user","content":"${m.map((i) => FRAGMENTS[i]).join('')}"}`);
  return Buffer.from(`{"model":"claude-sonnet-4-5","messages":[${parts.join(',')}]}`);
}

function keys(result: ScanResult): string[] {
  return result.findings.map(findingKey).sort();
}

function splitScan(body: Buffer, ranges: readonly ByteRange[], scanned = policy): ScanResult {
  const context = { jsonEscapes: carriesJsonEscapes(body) };
  return mergeResults(
    ranges.map((range, i) =>
      inspectReporting({
        body,
        policy: pooledPolicy(scanned),
        phase: 'request',
        secrets: SECRETS,
        part: 'all',
        range,
        context,
        modelWhole: i === 0,
      }),
    ),
  );
}

const reach = Math.max(secretsReach(SECRETS)!, splitPatterns(PATTERNS).reach);

// Filler often enough that the overlaps (2 × MIN_REACH credits) end before the body does.
const fragment = fc.oneof(
  { arbitrary: fc.constant(0), weight: 1 },
  { arbitrary: fc.integer({ min: 1, max: FRAGMENTS.length - 1 }), weight: 4 },
);

t.test('split findings equal whole findings, with edges at every seam', (t) => {
  let cuts = 0;
  fc.assert(
    fc.property(
      fc.array(fc.array(fragment, { minLength: 1, maxLength: 60 }), {
        minLength: 1,
        maxLength: 12,
      }),
      fc.array(fc.nat(), { maxLength: 24 }),
      (messages, picks) => {
        const body = bodyOf(messages);
        const ranges = rangesAt(body, pickedEdges(body, picks), reach);
        if (ranges === null) return;
        cuts += ranges.length - 1;
        for (const [scanned, scannedPlan] of [
          [policy, plan],
          [noPatterns, noPatternsPlan],
        ] as const) {
          const whole = scanBody(scannedPlan, { body, phase: 'request', secrets: SECRETS });
          t.strictSame(whole.failures, []);
          const split = splitScan(body, ranges, scanned);
          if (JSON.stringify(keys(split)) !== JSON.stringify(keys(whole)))
            throw new Error(`split ${JSON.stringify(keys(split))}\nwhole ${JSON.stringify(keys(whole))}`);
          t.strictSame(split.failures, []);
        }
      },
    ),
    { numRuns: 150 },
  );
  t.ok(cuts > 150, `the bodies were cut (${cuts} edges)`);
  t.end();
});

t.test('every edge is cut at, one at a time, in a body holding every fragment', (t) => {
  const all = FRAGMENTS.map((_, i) => i);
  const body = bodyOf([all.flatMap((i) => [0, i]), all.flatMap((i) => [0, i]).reverse()]);
  const whole = keys(scanBody(plan, { body, phase: 'request', secrets: SECRETS }));
  t.ok(whole.length >= 12, `the body holds findings of every inspector: ${whole.join(' | ')}`);
  let tried = 0;
  let cutAtNonEdge = 0;
  const differ: number[] = [];
  for (let e = 1; e < body.length; e++) {
    const ranges = rangesAt(body, [e], reach);
    if (!isEdge(body, e)) {
      if (ranges !== null) cutAtNonEdge++;
      continue;
    }
    if (ranges === null) continue; // the overlap ran to the end of the body
    tried++;
    if (JSON.stringify(keys(splitScan(body, ranges))) !== JSON.stringify(whole)) differ.push(e);
  }
  t.equal(cutAtNonEdge, 0, 'no cut where there is no edge');
  t.strictSame(differ, [], 'no cut changes the findings');
  t.ok(tried > 100, `${tried} edges cut at`);
  // The control: cut anywhere, with no overlap, and leaks at the seam are lost or changed.
  const first = body.indexOf('123-45-6789') + 5;
  const second = body.indexOf('123-45-6789', first) + 5;
  const naive = keys(
    splitScan(body, [
      { start: 0, end: first },
      { start: first, end: second },
      { start: second, end: body.length },
    ]),
  );
  t.notSame(naive, whole, 'a naive cut inside each SSN loses it');
  t.end();
});

t.test('a secret padded past the overlap, as sent, is found across a cut inside it', (t) => {
  for (const i of FRAGMENTS.flatMap((f, i) => (f.startsWith('walrus:') ? [i] : []))) {
    const body = bodyOf([[0, 0, i, 0, 0, 0, 0]]);
    const whole = keys(scanBody(plan, { body, phase: 'request', secrets: SECRETS }));
    t.ok(
      whole.some((k) => k.includes('walr****')),
      `the whole scan finds fragment ${i}`,
    );
    const ranges = rangesAt(body, [body.indexOf('walrus:') + 7], reach)!;
    t.ok(ranges[0].end - ranges[1].start < 2 * 1024 * 6, 'the overlap is a few KiB');
    t.strictSame(keys(splitScan(body, ranges)), whole, `cut inside fragment ${i}`);
  }
  t.end();
});

t.test('edges fall after a separator, on an ASCII byte, never inside a key, an escape or an entity', (t) => {
  const body = Buffer.from('{"a":"x\\u0041, y &#64;, é,é AKIAIOSFODNN7EXAMPLE, \\\\", z"}');
  const edges: number[] = [];
  for (let e = 1; e < body.length; e++) if (isEdge(body, e)) edges.push(e);
  for (const e of edges) {
    t.ok(',:{}[]\n'.includes(String.fromCharCode(body[e - 1])), `after a separator at ${e}`);
    t.ok(body[e] < 0x80, 'on an ASCII byte');
  }
  t.equal(edges.length, 6, 'after `{`, the `:` and four commas (not the one before `é`)');
  // A hidden control the normalized view drops is no edge: a mark after it sits on what precedes it.
  const control = Buffer.from('note,\u0000\u0301tail,\u007fx,\ty');
  const at = (s: string) => control.indexOf(s);
  t.notOk(isEdge(control, at('\u0000')), 'not on a NUL');
  t.notOk(isEdge(control, at('\u007f')), 'not on a DEL');
  t.ok(isEdge(control, at('\t')), 'on a tab, which the view keeps');
  t.end();
});

t.test('planRanges cuts a large body into about equal ranges that cover it', (t) => {
  const body = bodyOf(Array.from({ length: 400 }, (_, m) => FRAGMENTS.map((_, i) => (i + m) % FRAGMENTS.length)));
  const ranges = planRanges(body, 4, reach)!;
  t.equal(ranges.length, 4);
  t.equal(ranges[0].start, 0);
  t.equal(ranges.at(-1)!.end, body.length);
  for (let i = 1; i < ranges.length; i++) {
    t.ok(ranges[i].start < ranges[i - 1].end, 'each range overlaps the one before');
    t.ok(Math.abs(ranges[i].start - (i * body.length) / 4) < body.length / 16, 'near its share');
  }
  t.strictSame(keys(splitScan(body, ranges)), keys(scanBody(plan, { body, phase: 'request', secrets: SECRETS })));
  // A body with no edge (one run of digits) is not cut.
  t.equal(planRanges(Buffer.alloc(1 << 20, '7'), 4, reach), null);
  t.end();
});

t.test('how far a pattern can match across an edge', (t) => {
  const chars = (source: string) => patternReach(source)! / 4;
  t.equal(chars('ticket:[0-9]{4}'), 'ticket:[0-9]{4}'.length * 4, 'bounded, and holds a separator');
  t.equal(chars('a:{2,3}(b{2}){5}'), 16 * 3 * 2 * 5, 'repetitions multiply, nested or not');
  t.equal(chars('[,*+^$]x'), 8, 'quantifier characters in a class are literal');
  t.equal(chars('\\Q:*+\\E'), 7);
  for (const free of [
    '[a-z0-9-]+\\.corp\\.example\\.com',
    '\\bxox[baprs]-[0-9A-Za-z-]{10,}',
    '-----BEGIN [A-Z ]*PRIVATE KEY-----',
    '(?i)secret\\w+',
    '[[:alpha:]]+@x',
  ])
    t.equal(patternReach(free), 0, `${free}: no match holds a separator, so none crosses an edge`);
  for (const whole of [
    'a.*b',
    '\\S{6,}',
    'x\\s+y',
    '[^a]+',
    '[+-;]+',
    'k[: ]+v',
    '\\p{L}+',
    '\\{+',
    '^abc',
    'abc$',
    'x\\B',
    '\\Aabc',
    'abc\\z',
    // a class range whose end is an escape reaches what the escape names (an attacker review found
    // `[a-\x7e]` and `[\t-\r]` read as holding no separator: `}` and the newline are in them)
    '[a-\\x7e]+',
    '[_-\\x{7d}]+',
    '[\\t-\\r]+',
    '[\\x20-\\x7e]+',
    '[\\054-/]+',
  ])
    t.equal(patternReach(whole), null, `${whole} scans whole`);
  t.equal(
    patternReach('zz[a-\\x7e]{1,30}yy'),
    'zz[a-\\x7e]{1,30}yy'.length * 30 * 4,
    'bounded, a separator in the range',
  );
  t.equal(patternReach('[\\t-\\r ]{1,4}'), '[\\t-\\r ]{1,4}'.length * 4 * 4, 'a newline in the range');
  t.equal(patternReach('[a-\\x6f]+'), null, "an escape at a range's end is not read: taken to reach a separator");
  t.equal(patternReach(':{1000}{1000}'), null, 'too long to split for');
  const split = splitPatterns([{ pattern: 'a:+' }, { pattern: 'b:c' }, { pattern: 'd+' }]);
  t.strictSame(split, { ranged: [{ pattern: 'b:c' }, { pattern: 'd+' }], whole: [{ pattern: 'a:+' }], reach: 12 });
  t.equal(secretsReach(['x'.repeat(20_000)]), null, 'a secret too long to split for');
  t.end();
});
