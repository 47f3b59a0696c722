import fc from 'fast-check';
import RE2 from 're2';
import t from 'tap';
import { findNeedle, MAX_NEEDLE, type Needle, needleProblem, needleSearch } from '../../pipeline/literal-search.ts';
import { type Anchor, anchorOf, foldedPlan, locate } from '../../pipeline/pattern-anchors.ts';

// The SIMD literal search (literal-search.ts) against a byte-by-byte reading, around the 64 KB seams
// of its chunks; and a custom pattern's anchor located through it against the same anchor located by
// re2 and Buffer.indexOf alone, on texts full of case variants, the Kelvin sign and the long s.

/** Every start of `needle` read byte by byte (ASCII folding when it folds). */
function naive(view: Uint8Array, needle: Needle): number[] {
  const lower = (b: number) => (needle.fold && b >= 0x41 && b <= 0x5a ? b | 0x20 : b);
  const out: number[] = [];
  for (let i = 0; i + needle.bytes.length <= view.length; i++) {
    let k = 0;
    while (k < needle.bytes.length && lower(view[i + k]) === needle.bytes[k]) k++;
    if (k === needle.bytes.length) out.push(i);
  }
  return out;
}

/** A second to locate in: what is compared is what is found, not how fast a loaded host finds it. */
const second = () => performance.now() + 1000;

/** The same anchor with every literal left to re2 (folded) or Buffer.indexOf (case-sensitive). */
const withoutSimd = (a: Anchor): Anchor => ({
  ...a,
  folded: a.folded.map(() => null),
  needles: a.needles.map(() => null),
});

t.test('the module runs here (x64 with SSE4.1, or arm64): the rest of this file tests it', async (t) => {
  t.equal(needleSearch, 'simd');
});

t.test('re2 folds an ASCII letter to a character outside ASCII for k and s only (U+212A, U+017F)', async (t) => {
  // Every code point but the surrogates, once each, then every ASCII letter's folded matches in it.
  const points: number[] = [];
  for (let cp = 0x80; cp <= 0x10ffff; cp++) if (cp < 0xd800 || cp > 0xdfff) points.push(cp);
  let chars = '';
  for (let k = 0; k < points.length; k += 4096) chars += String.fromCodePoint(...points.slice(k, k + 4096));
  const text = Buffer.from(chars);
  const beyond: string[] = [];
  for (const letter of 'abcdefghijklmnopqrstuvwxyz') {
    const re = new RE2(`(?i)${letter}`, 'gu');
    for (const m of text.toString().matchAll(re as unknown as RegExp))
      beyond.push(`${letter}:${m[0].codePointAt(0)!.toString(16)}`);
  }
  t.same(beyond, ['k:212a', 's:17f']);
});

t.test('a needle is ASCII without k or s when it folds, any bytes otherwise', async (t) => {
  t.equal(needleProblem(Buffer.from('project'), true), null);
  t.match(needleProblem(Buffer.from('pass'), true), /`k` or `s`/);
  t.match(needleProblem(Buffer.from('Project'), true), /upper-case/);
  t.match(needleProblem(Buffer.from('café'), true), /outside ASCII/);
  t.equal(needleProblem(Buffer.from('café ssn'), false), null);
  t.match(needleProblem(Buffer.alloc(MAX_NEEDLE + 1, 0x61), false), /1 to 64 bytes/);
  t.match(needleProblem(Buffer.alloc(0), false), /1 to 64 bytes/);
});

t.test('property: every start, folded or not, as a byte-by-byte reading finds them, across chunk seams', async (t) => {
  const alphabet = 'aAbBjJeE-_. \u212a\u017fxX';
  fc.assert(
    fc.property(
      fc.constantFrom('je', 'project', 'e', 'a-b', '_', 'xx_', 'jeje', 'abababababababababab'),
      fc.boolean(),
      fc.integer({ min: 0, max: 140_000 }),
      fc.integer({ min: 0, max: 2 ** 31 - 1 }),
      fc.nat(),
      fc.nat(),
      (literal, fold, length, seed, a, b) => {
        let s = seed;
        const next = () => {
          s = (Math.imul(s, 1103515245) + 12345) >>> 0;
          return s >>> 8;
        };
        // Mostly one letter of the needle, so that its starts crowd the seams.
        const chars = [...alphabet];
        const parts: string[] = [];
        for (let bytes = 0; bytes < length; ) {
          const part = next() % 3 === 0 ? literal : chars[next() % chars.length];
          parts.push(part);
          bytes += Buffer.byteLength(part);
        }
        const view = Buffer.from(parts.join(''));
        const bytes = Buffer.from(fold ? literal : next() % 2 ? literal.toUpperCase() : literal);
        const needle: Needle = { bytes, fold, pivots: [a % bytes.length, b % bytes.length] };
        const got = findNeedle(view, needle, 1e9, 1e9);
        const want = naive(view, needle);
        if (JSON.stringify(got) !== JSON.stringify(want))
          throw new Error(`${literal} ${fold} ${length}: ${got?.length} vs ${want.length}`);
      },
    ),
    { numRuns: 300 },
  );
  t.pass('300 texts up to 140 KB');
});

t.test('every start at every offset around a chunk seam (16 KB), for each needle length', async (t) => {
  let checked = 0;
  for (const length of [1, 2, 3, 15, 16, 17, 63, 64]) {
    const bytes = Buffer.alloc(length);
    for (let k = 0; k < length; k++) bytes[k] = 0x61 + (k % 3) + (k % 5 === 4 ? 0x0d : 0); // a b c (no k, no s)
    const needle: Needle = { bytes, fold: true, pivots: [0, length - 1] };
    for (let at = 16384 - length - 2; at <= 16384 + 2; at++) {
      const view = Buffer.alloc(16384 + 80, 0x2e);
      view.set(Buffer.from(bytes.toString().toUpperCase()), at);
      t.same(findNeedle(view, needle, 10, 10_000), [at], `length ${length} at ${at}`);
      checked++;
    }
    // At the very end of the view, and one byte short of it.
    const end = Buffer.alloc(70_000, 0x2e);
    end.set(bytes, end.length - length);
    t.same(findNeedle(end, needle, 10, 10_000), [end.length - length]);
    t.same(findNeedle(end.subarray(0, end.length - 1), needle, 10, 10_000), []);
  }
  t.ok(checked > 40);
});

t.test('past its bounds or its deadline the search gives up (null): the caller runs the pattern whole', async (t) => {
  const needle: Needle = { bytes: Buffer.from('ab'), fold: true, pivots: [0, 1] };
  const view = Buffer.from('ab '.repeat(50_000));
  t.equal(findNeedle(view, needle, 1e9, 1e9)?.length, 50_000);
  t.equal(findNeedle(view, needle, 49_999, 1e9), null, 'one start more than it may report');
  t.equal(findNeedle(view, needle, 50_000, 1e9)?.length, 50_000, 'exactly as many');
  // Pivots that agree everywhere, the rest never: probes, not starts, run out.
  const probe: Needle = { bytes: Buffer.from('axb'), fold: false, pivots: [0, 2] };
  const near = Buffer.from('ayb'.repeat(50_000));
  t.same(findNeedle(near, probe, 10, 1e9), []);
  t.equal(findNeedle(near, probe, 10, 49_999), null, 'checked in full once too often');
  t.equal(findNeedle(Buffer.alloc(200_000, 0x2e), needle, 10, 10, performance.now() - 1), null, 'past its deadline');
});

t.test('a folded literal: its run without k or s, and the rest read around it as re2 folds', async (t) => {
  const project = foldedPlan('Project')!;
  t.ok(project.exact);
  t.equal(Buffer.from(project.needle.bytes).toString(), 'project');
  const password = foldedPlan('password')!;
  t.notOk(password.exact);
  t.equal(Buffer.from(password.needle.bytes).toString(), 'word');
  t.equal(Buffer.from(password.head).toString(), 'pass');
  t.equal(foldedPlan('ssn'), null, 'no run of two bytes');
  t.equal(foldedPlan('café'), null, 'outside ASCII: re2');
  const anchor = anchorOf('(?i)password\\s*[:=]')!;
  const view = Buffer.from('PA\u017f\u017fWORD: pas\u017fword= passWord pass word xpassword paSSwor ſword password');
  const starts = (locate(view, anchor, second()) ?? []).filter((_, k) => k % 2 === 0);
  t.same(locate(view, anchor, second()), locate(view, withoutSimd(anchor), second()));
  t.equal(starts.length, 5, 'every spelling re2 finds, and no near miss');
});

const LITERALS = [
  '(?i)password',
  '(?i)kiss',
  '(?i)sk-ant',
  '(?i)api[-_]?key',
  '(?i)Project[- ]x',
  '(?i)ask(?:s|ed)',
  '(?i)token',
  '(?i)xx',
  'acct_[0-9]+',
  'eyJ[a-z]+',
  '_x_',
  'a.b',
];
const PIECES = [
  'pass',
  'PASS',
  'pa\u017f\u017f',
  'word',
  'WoRd',
  'kiss',
  '\u212aiss',
  'ki\u017fS',
  'sk-ant',
  '\u017f\u212a-ANT',
  'api',
  'key',
  'KEY',
  '\u212aey',
  '-',
  '_',
  'project',
  'PROJECT',
  ' x',
  'askS',
  'ASKED',
  'a\u017f\u212aed',
  'token',
  'to\u212aen',
  'xx',
  'acct_',
  '12',
  'eyJ',
  'abc',
  '_x_',
  'a.b',
  'é',
  ' ',
  '\n',
  'p',
  's',
  'k',
];

t.test('property: a located anchor finds what re2 and Buffer.indexOf alone find, at seams too', async (t) => {
  let simdLocated = 0;
  fc.assert(
    fc.property(
      fc.constantFrom(...LITERALS),
      fc.array(fc.constantFrom(...PIECES), { minLength: 1, maxLength: 400 }),
      fc.integer({ min: 0, max: 3 }),
      (source, pieces, pad) => {
        const anchor = anchorOf(source);
        if (anchor === null) throw new Error(`no anchor: ${source}`);
        const text = pieces.join('');
        // Some texts straddle a seam of the search's chunks (16 KB).
        const view = Buffer.from(pad === 0 ? '.'.repeat(16384 - 200) + text : text);
        const simd = anchor.folded.some((p) => p !== null) || anchor.needles.some((n) => n !== null);
        if (simd) simdLocated++;
        const got = locate(view, anchor, second());
        const want = locate(view, withoutSimd(anchor), second());
        if (JSON.stringify(got) !== JSON.stringify(want))
          throw new Error(`${source} on ${JSON.stringify(text)}: ${got} vs ${want}`);
      },
    ),
    { numRuns: 2000 },
  );
  t.ok(simdLocated > 1000, `most anchors searched by SIMD (${simdLocated})`);
});
