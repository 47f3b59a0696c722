import fc from 'fast-check';
import t from 'tap';
import { isEdge, mergeResults, rangesAt, secretsReach, type ByteRange } from '../../pipeline/byte-ranges.ts';
import type { PatternPlan } from '../../pipeline/inspectors/patterns.ts';
import { anchorOf, runsIntoEnds } from '../../pipeline/pattern-anchors.ts';
import { carriesJsonEscapes } from '../../pipeline/json-view.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { findingKey, scanBody, type ScanResult } from '../../pipeline/scan.ts';
import { inspectReporting } from '../../pipeline/worker.ts';
import { pickedEdges } from './range-cuts.ts';
import { builtinsWith } from './policy-fixture.ts';
import { pooledPolicy } from '../../pipeline/pooled-policy.ts';

// Custom patterns whose matches can be any length and hold a separator (`\S{6,}`, `[: ]+`) are split
// by byte range too, found around their literal: a range that cannot hold a match's window runs that
// pattern over the whole body's view (patterns.ts, OpenRange). The split must find what the whole scan
// finds, for matches much longer than any overlap, cut anywhere inside them.

const UNBOUNDED = [
  { pattern: '(?i)\\bpassword\\s*[:=]\\s*\\S{6,}', description: 'password assignment', severity: 'warn' },
  { pattern: '(?i)confidential[: ]+internal', description: 'marking', severity: 'block' },
  { pattern: 'tag\\[[a-z,]+\\]', description: 'tag list', severity: 'log' },
  { pattern: 'BEGIN[^}]*END', description: 'block', severity: 'warn' },
];
const policy = builtinsWith(UNBOUNDED);
const plan = compilePlan(policy);
const patternPlan = plan.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan;
const SECRETS = ['zebra:crossing-42'];
const reach = Math.max(secretsReach(SECRETS)!, patternPlan.rangeReach!);

const run = (n: number, s: string) => s.repeat(n);
const FILLER = 'lorem ipsum dolor sit amet, consectetur adipiscing elit: sed do eiusmod tempor. '.repeat(12);
// Matches far longer than an overlap (a few KiB), with separators all through them so that an edge can
// fall anywhere inside; written plainly, escaped, folded (ſ, K), and padded with what only the
// normalized view drops; and literals with no match after them.
const FRAGMENTS = [
  FILLER,
  'password: hunter22 ',
  `PASSWORD = ${run(900, 'hunter2,')} `,
  `Password:${run(3000, ' ')}s3cr3t-value `,
  `pa\u017f\u017fword: abcdefgh `,
  'pass\\u0077ord= qwerty123 ',
  `password:${run(1500, '\\u200b')}abcdefg `,
  `confidential${run(3000, ': ')}internal `,
  `CONFIDENTIAL:${run(4000, ' ')}InTernal `,
  `confidential:${run(3000, '\u200b')}internal `,
  `confidential:${run(2000, '&#32;')}internal `,
  `tag[${run(1500, 'ab,')}z] `,
  `BEGIN ${run(300, 'x: y, [z] ')}END `,
  `BEGIN ${run(400, 'no end here, ')} `,
  'the password is not here, confidential, internal, tag[] ',
  'zebra:crossing-42 ',
  'alice@example.org AKIAIOSFODNN7EXAMPLE ',
  '\\n\\t\\"quoted\\" café ☕ ',
];

function bodyOf(messages: number[][]): Buffer {
  const parts = messages.map((m) => `{"role":"user","content":"${m.map((i) => FRAGMENTS[i]).join('')}"}`);
  return Buffer.from(`{"model":"claude-sonnet-4-5","messages":[${parts.join(',')}]}`);
}

const keys = (result: ScanResult) => result.findings.map(findingKey).sort();
const whole = (body: Buffer) => scanBody(plan, { body, phase: 'request', secrets: SECRETS });

/** The ranges scanned as the pool's workers scan them (worker.ts), merged as the engine merges them. */
function splitScan(body: Buffer, ranges: readonly ByteRange[]): ScanResult {
  const context = { jsonEscapes: carriesJsonEscapes(body) };
  return mergeResults(
    ranges.map((range) =>
      inspectReporting({
        body,
        policy: pooledPolicy(policy),
        phase: 'request',
        secrets: SECRETS,
        part: 'all',
        range,
        context,
      }),
    ),
  );
}

t.test('the plan splits these patterns by range: each reaches only its literal across an edge', (t) => {
  t.strictSame(
    patternPlan.patterns.map((p) => p.unbounded),
    [true, true, true, true],
  );
  t.equal(patternPlan.rangeReach, 'confidential'.length * 4, 'the longest literal, folded: 4 bytes a letter');
  const none = compilePlan(builtinsWith([{ pattern: '[A-Z]{3}[: ]+[0-9]{3}', description: 'x', severity: 'log' }]));
  const nonePlan = none.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan;
  t.equal(nonePlan.rangeReach, null, 'unbounded with no literal: the body is not split by range');
  t.end();
});

t.test('every edge is cut at, one at a time, in a body holding every fragment', (t) => {
  const all = FRAGMENTS.map((_, i) => i);
  const body = bodyOf([all.flatMap((i) => [0, i]), all.flatMap((i) => [0, i]).reverse()]);
  const expected = keys(whole(body));
  for (const match of ['pass****', 'PASS****', 'Pass****', 'paſſ****', 'conf****', 'CONF****', 'tag[****', 'BEGI****'])
    t.ok(
      expected.some((k) => k.includes(`\u0000${match}\u0000`)),
      `the whole scan finds ${match}`,
    );
  let tried = 0;
  const differ: number[] = [];
  // The body has thousands of edges, most of them inside the long matches: every 97th (each cut
  // costs ~50 ms: the ranges escalate, each decoding the whole body).
  let edge = 0;
  for (let e = 1; e < body.length; e++) {
    if (!isEdge(body, e) || edge++ % 97 !== 0) continue;
    const ranges = rangesAt(body, [e], reach);
    if (ranges === null) continue;
    tried++;
    if (JSON.stringify(keys(splitScan(body, ranges))) !== JSON.stringify(expected)) differ.push(e);
    if (differ.length > 5) break;
  }
  t.strictSame(differ, [], 'no cut changes the findings');
  t.ok(tried > 100, `${tried} edges cut at`);
  t.end();
});

t.test('the control: a range scanned as if it were a whole body loses the long matches across its edge', (t) => {
  const body = bodyOf([[0, 0, 7, 0, 0, 0, 0]]);
  const at = body.indexOf('confidential') + 'confidential'.length + 3001;
  const ranges = rangesAt(body, [at], reach)!;
  t.ok(ranges[0].end - ranges[1].start < 64 * 1024, 'the overlap is far shorter than the match');
  t.ok(keys(whole(body)).some((k) => k.includes('conf****')));
  t.ok(
    keys(splitScan(body, ranges)).some((k) => k.includes('conf****')),
    'the split finds the 6 KB match across its edge',
  );
  const context = { jsonEscapes: carriesJsonEscapes(body) };
  const naive = mergeResults(
    ranges.map((r) =>
      scanBody(plan, { body: body.subarray(r.start, r.end), phase: 'request', secrets: SECRETS, context }),
    ),
  );
  t.notOk(
    keys(naive).some((k) => k.includes('conf****')),
    'without reading past the range, neither range holds the match',
  );
  t.end();
});

const fragment = fc.oneof(
  { arbitrary: fc.constant(0), weight: 1 },
  { arbitrary: fc.integer({ min: 1, max: FRAGMENTS.length - 1 }), weight: 3 },
);

t.test('split findings equal whole findings for random bodies cut at random edges', (t) => {
  let cuts = 0;
  fc.assert(
    fc.property(
      fc.array(fc.array(fragment, { minLength: 1, maxLength: 16 }), { minLength: 1, maxLength: 6 }),
      fc.array(fc.nat(), { maxLength: 12 }),
      (messages, picks) => {
        const body = bodyOf(messages);
        const ranges = rangesAt(body, pickedEdges(body, picks), reach);
        if (ranges === null) return;
        cuts += ranges.length - 1;
        const expected = whole(body);
        t.strictSame(expected.failures, []);
        const split = splitScan(body, ranges);
        if (JSON.stringify(keys(split)) !== JSON.stringify(keys(expected)))
          throw new Error(`split ${JSON.stringify(keys(split))}\nwhole ${JSON.stringify(keys(expected))}`);
        t.strictSame(split.failures, []);
      },
    ),
    { numRuns: 100 },
  );
  t.ok(cuts > 100, `the bodies were cut (${cuts} edges)`);
  t.end();
});

t.test('a flood of literals: matches inside a range and across its edge, and the findings bound, as whole', (t) => {
  // More occurrences of `confidential` than windows are made for (pattern-anchors.ts, MAX_ANCHOR_HITS):
  // a range then runs the pattern over its own view, or over the whole body where a match may run past it.
  const flood = 'confidential '.repeat(1500);
  const ids = Array.from({ length: 64 }, (_, i) => `tag[${String.fromCharCode(97 + (i % 26))}${i}x,y]`).join(' ');
  const shapes: [string, string[]][] = [
    ['no match anywhere', [flood, FILLER, FILLER, flood]],
    [
      'a match inside each range',
      [flood, 'confidential: internal ', FILLER, FILLER, flood, 'CONFIDENTIAL : INTERNAL '],
    ],
    ['a 6 KB match across the edge', [flood, FILLER, `confidential${run(3000, ': ')}internal `, FILLER, FILLER]],
    ['64 distinct matches of another pattern', [ids, flood, FILLER, FILLER, flood]],
  ];
  for (const [name, contents] of shapes) {
    const body = Buffer.from(
      JSON.stringify({ model: 'claude-sonnet-4-5', messages: contents.map((content) => ({ role: 'user', content })) }),
    );
    const expected = keys(whole(body));
    let tried = 0;
    for (const at of [0.3, 0.5, 0.55, 0.7].map((f) => Math.floor(body.length * f))) {
      let e = at;
      while (e < body.length && !isEdge(body, e)) e++;
      const ranges = rangesAt(body, [e], reach);
      if (ranges === null) continue;
      tried++;
      t.strictSame(keys(splitScan(body, ranges)), expected, `${name}: cut at ${e}`);
    }
    t.ok(tried >= 2, `${name}: cut ${tried} times`);
  }
  t.end();
});

t.test('attacker review: folded alternatives at one place, and occurrences that end out of order', (t) => {
  // `(?i)(?:abc|ab)[c-d]…` on `abc:`: the match goes through `ab`, its `c` read by the class. Located as
  // `abc` alone (one leftmost-first alternation), the window ended before `:` and the match was lost,
  // in the whole scan from 64 KB and in a range with fewer occurrences than the flood bound.
  const folded = builtinsWith([
    { pattern: '(?i)(?:abc|ab)[c-d][: ]+[x-z]+', description: 'codename', severity: 'block' },
  ]);
  const foldedPlan = compilePlan(folded);
  for (const count of [500, 1500]) {
    const messages = Array.from({ length: count }, (_, i) => ({
      role: 'user',
      content: i === Math.floor(count / 2) ? `${FILLER.slice(0, 120)} abc: xyz` : `${FILLER.slice(0, 120)} abc. `,
    }));
    const body = Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', messages }));
    const expected = scanBody(foldedPlan, { body, phase: 'request', secrets: [] });
    t.strictSame(
      expected.findings.map((f) => f.match),
      ['abc:****'],
      `${count} occurrences, ${body.length} bytes: the whole scan finds it`,
    );
    const reachOf = (foldedPlan.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan)
      .rangeReach!;
    let e = Math.floor(body.length / 3);
    while (!isEdge(body, e)) e++;
    const ranges = rangesAt(body, [e], reachOf)!;
    const context = { jsonEscapes: carriesJsonEscapes(body) };
    const split = mergeResults(
      ranges.map((range) =>
        inspectReporting({
          body,
          policy: pooledPolicy(folded),
          phase: 'request',
          secrets: [],
          part: 'all',
          range,
          context,
        }),
      ),
    );
    t.strictSame(keys(split), keys(expected), `${count} occurrences: the split finds it`);
  }
  // `abcde` at 0 and `bc` at 1 end at 5 and 3: the suffix walk must start again at both.
  const alternatives = anchorOf('(?:abcde|bc)[d][e][: ]+[x-z]+')!;
  const view = Buffer.from(`abcde${': '.repeat(40)}`);
  t.equal(runsIntoEnds(view, alternatives, [0, 5, 1, 3], false, true), true, 'the match through `bc` runs to the end');
  t.equal(runsIntoEnds(view, alternatives, null, false, true), true);
  t.end();
});
