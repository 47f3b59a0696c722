import fc from 'fast-check';
import RE2 from 're2';
import t from 'tap';
import { BENCH_PATTERNS } from '../../bench/corpus.ts';
import { WORST_PATTERNS } from '../../bench/worst-case.ts';
import {
  anchoredMatches,
  compile,
  hits as hits_,
  LOCATE_MIN_NS,
  LOCATE_NS_PER_BYTE,
  LOCATED_FROM_BYTES,
  matches,
  scan,
} from '../../pipeline/inspectors/patterns.ts';
import { anchorOf, locate, MAX_ANCHOR_HITS, MAX_NEEDLE_PROBES, windows } from '../../pipeline/pattern-anchors.ts';
import type { CustomPattern } from '../../pipeline/policy/types.ts';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { MAX_FINDINGS_PER_INSPECTOR, redact } from '../../pipeline/finding.ts';

// The fast path (a pattern run only in the windows around its literal, and literals instead of the
// RE2.Set pass) against the plain one (the set, then the pattern over the whole view): the same
// matches, at the same offsets, in the same order, on random patterns and random texts built to hold
// near misses, case variants (the Kelvin sign and the long s fold to k and s), multi-byte characters
// and matches at window seams.

/** Every match as [offset, hex]: what the two paths must agree on exactly. */
function plainMatches(regex: RE2, view: Buffer): [number, string][] {
  return [...matches(regex, view)].map((m) => [m.index, m[0].toString('hex')]);
}
/** The same through the windows; `source` as written (the engine reads the policy's, not re2's `source`). */
function fastMatches(regex: RE2, view: Buffer, source = regex.source): [number, string][] | null {
  const anchor = anchorOf(source);
  if (!anchor) return null;
  return [...anchoredMatches(regex, anchor, view)].map((m) => [m.index, m[0].toString('hex')]);
}

t.test('the bench and worst-case patterns all have anchors, with the literal and bounds expected', async (t) => {
  for (const p of [...BENCH_PATTERNS, ...WORST_PATTERNS]) t.ok(anchorOf(p.pattern), p.pattern);
  const host = anchorOf('\\b[a-z0-9-]+\\.corp\\.example\\.com\\b')!;
  t.same(host.literals.map(String), ['.corp.example.com']);
  t.equal(host.before, Infinity);
  t.equal(host.after, 0);
  const ip = anchorOf('\\b(?:10|192\\.168)\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\b')!;
  t.same(ip.literals.map(String), ['10.', '192.168.'], 'a group of literals, with the literal after it');
  t.equal(ip.after, 11);
  const folded = anchorOf('(?i)project[- ]nightingale')!;
  t.ok(folded.fold && folded.locators.length === 1, 'a folded literal is located by re2, folding as the pattern does');
});

t.test('syntax the reader does not follow gives no anchor (the pattern runs whole)', async (t) => {
  for (const p of [
    'abc|def', // top-level alternation
    'ab(?i)cd', // flags later on
    '(?i:ab)cd',
    '\\Qa.b\\E',
    '\\1abc',
    '[a-z]+', // no literal at all
    '\\d{3}-?\\d{4}', // literal only under a quantifier
    '(?-i)abc',
  ])
    t.equal(anchorOf(p), null, p);
});

t.test('a folded literal finds the Kelvin sign and the long s, as re2 does', async (t) => {
  const regex = new RE2('(?i)kiss[0-9]+', 'gu');
  const view = Buffer.from('x \u212ai\u017f\u017f42 KISS7 kis9 kiss', 'utf8');
  t.same(fastMatches(regex, view), plainMatches(regex, view));
  t.equal(plainMatches(regex, view).length, 2);
});

t.test(
  'under (?i) a longer alternative starting like a shorter one, and non-ASCII folding to ASCII, are kept (attacker review)',
  async (t) => {
    const engine = new InspectionEngine({ threads: 0, registry: createRegistry() });
    t.teardown(() => engine.close());
    for (const [pattern, secret] of [
      ['(?i)(pass|password)\\s*[:=]\\s*\\S+', 'my password: hunter2 ok'],
      ['(?i)(api|api_key)\\s*[:=]\\s*\\S+', 'the API_KEY=abc here'],
      ['(?i)token\\d+ſ\\d', 'the token12s3 here'],
      ['(?i)acct[\\x{212A}]\\d', 'the acctk7 here'],
      ['(?i)[ſ]\\d+token', 'an s12token here'],
      ['(?i)id[\\x{100}-\\x{24F}]+\\d', 'the idss7 here'],
    ]) {
      const policy = policyFromDocument(
        validatePolicyDocument({
          content_inspection: { patterns: [{ pattern, description: 'x', severity: 'block' }] },
        }),
      );
      // 1 KB: the set pass, then the pattern over the whole view; 100 and 300 KB: located without the
      // set pass (from 8 KB), the pattern run in windows (from 64 KB).
      for (const kb of [1, 100, 300]) {
        const content = secret + ' lorem ipsum'.repeat(Math.ceil((kb * 1024) / 12));
        const body = Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }));
        t.equal((await engine.inspect({ body, phase: 'request', policy })).decision, 'block', `${pattern} at ${kb} KB`);
      }
    }
  },
);

t.test('overlapping occurrences of a literal are each located', async (t) => {
  const regex = new RE2('(?i)aba[0-9]', 'gu');
  const view = Buffer.from('xx ABAba1 abababa2');
  t.same(fastMatches(regex, view), plainMatches(regex, view));
  t.equal(plainMatches(regex, view).length, 2);
});

t.test('\\b at a window start reads the byte before it; a match is not cut at a window end', async (t) => {
  const regex = new RE2('\\bINC-[0-9]{6}\\b', 'gu');
  const view = Buffer.from('xINC-123456 INC-1234567 INC-123456 (INC-654321)');
  t.same(fastMatches(regex, view), plainMatches(regex, view));
  const greedy = new RE2('eyJ[A-Za-z0-9_-]{10,}\\.eyJ[A-Za-z0-9_-]{10,}', 'gu');
  const token = `eyJ${'a'.repeat(5000)}.eyJ${'b'.repeat(3000)} eyJshort.eyJ`;
  t.same(fastMatches(greedy, Buffer.from(token)), plainMatches(greedy, Buffer.from(token)));
});

t.test('past the bound of occurrences, or a suffix living through the view, the pattern runs whole', async (t) => {
  const regex = new RE2('\\bacct_[0-9]{8,12}\\b', 'gu');
  const view = Buffer.from('acct_1 '.repeat(MAX_ANCHOR_HITS + 5) + 'acct_123456789');
  const anchor = anchorOf(regex.source)!;
  t.equal(locate(view, anchor), null, 'too many occurrences: not located');
  const flood = Buffer.from(`${'_'.repeat(MAX_NEEDLE_PROBES + 10)} acct_12345678`);
  t.equal(anchor.literals[0].subarray(anchor.pivots[0]).toString(), '_', 'indexOf would look from its rarest byte');
  const byIndexOf = { ...anchor, needles: anchor.needles.map(() => null) };
  t.equal(locate(flood, byIndexOf), null, 'a needle everywhere and rarely the literal: not located');
  t.ok(anchor.needles[0], '`_` is common: the SIMD search looks for two bytes at once');
  // A second's deadline: what is tested is the search, not how fast a cold process runs it.
  const second = () => performance.now() + 1000;
  t.same(
    locate(flood, anchor, second()),
    [flood.length - 13, flood.length - 8],
    'which a flood of one of them does not stop',
  );
  const both = Buffer.from(`${'xcxx_'.repeat(MAX_NEEDLE_PROBES)} acct_12345678`);
  t.equal(locate(both, anchor, second()), null, 'a flood of both its pivots, never the literal: not located');
  t.same(fastMatches(regex, both), plainMatches(regex, both));
  t.same(fastMatches(regex, flood), plainMatches(regex, flood));
  t.same(fastMatches(regex, view), plainMatches(regex, view));
  const host = new RE2('\\b[a-z0-9-]+\\.corp\\.example\\.com\\b', 'gu');
  const xs = Buffer.from(`${'x'.repeat(300_000)}.corp.example.com`);
  t.equal(locate(xs, anchorOf(host.source)!, performance.now() - 1), null, 'past its deadline, a chunk at a time');
  t.same(fastMatches(host, xs), plainMatches(host, xs), "a flood of the needle's first byte");
  const password = new RE2('(?i)\\bpassword\\s*[:=]\\s*\\S{6,}', 'gu');
  const long = Buffer.from(`${'password:'.repeat(200)}${'x'.repeat(200_000)}`);
  const a = anchorOf(password.source)!;
  t.equal(windows(long, a, locate(long, a)!), null, 'the suffix walks would read too much');
  t.same(fastMatches(password, long), plainMatches(password, long));
});

// Random patterns from pieces re2 accepts, each with strings it matches, so that random texts built
// from those samples (whole, cut short, in other cases) hold matches, near misses and seams.
const ATOMS: [string, string[]][] = [
  ['a', ['a']],
  ['b', ['b']],
  ['k', ['k']],
  ['s', ['s']],
  ['x', ['x']],
  ['yz', ['yz']],
  ['-', ['-']],
  ['_', ['_']],
  ['\\.', ['.']],
  [':', [':']],
  ['=', ['=']],
  ['0', ['0']],
  ['1', ['1']],
  ['é', ['é']],
  [' ', [' ']],
  ['\\d', ['3', '0']],
  ['\\w', ['w', '_', 'Z']],
  ['\\s', [' ', '\n', '\t']],
  ['\\S', ['q', 'é', '-']],
  ['\\b', ['']],
  ['\\B', ['']],
  ['.', ['.', 'é', 'q']],
  ['[a-z]', ['m', 'k']],
  ['[^ ]', ['x', 'é', '\n']],
  ['[0-9-]', ['5', '-']],
  ['[ks]', ['k', 's']],
  ['[:=]', [':', '=']],
  ['(?:ab|k)', ['ab', 'k']],
  ['(?:x|yz)', ['x', 'yz']],
  ['(?:10|192\\.168)', ['10', '192.168']],
  ['\\x41', ['A']],
  // Non-ASCII characters that fold to ASCII letters under (?i) (attacker's review: a window walk that
  // stopped at the `s` a `ſ` matched).
  ['ſ', ['ſ', 's', 'S']],
  ['[ſ]', ['s', 'ſ']],
  ['\\x{212A}', ['k', 'K']],
  ['[\\x{100}-\\x{24F}]', ['s', 'ā']],
  ['$', ['']],
  ['^', ['']],
];
const ASSERTIONS = new Set(['\\b', '\\B', '$', '^']);
const QUANTIFIERS: [string, number, number][] = [
  ['', 1, 1],
  ['', 1, 1],
  ['', 1, 1],
  ['?', 0, 1],
  ['*', 0, 3],
  ['+', 1, 3],
  ['{2}', 2, 2],
  ['{1,3}', 1, 3],
  ['{2,}', 2, 4],
  ['*?', 0, 3],
  ['+?', 1, 3],
];
const LITERALS: [string, string][] = [
  ['kiss', 'kiss'],
  ['ab', 'ab'],
  ['aba', 'aba'],
  ['xyz', 'xyz'],
  ['a-b', 'a-b'],
  ['INC-', 'INC-'],
  ['eyJ', 'eyJ'],
  ['pass', 'pass'],
  ['é1', 'é1'],
  ['sk', 'sk'],
  ['192\\.168\\.', '192.168.'],
  // Alternatives one of which starts another (attacker's review: under (?i) re2 located `pass` where
  // `password` matched, and the window ended at its `w`).
  ['(pass|password)', 'password'],
  ['(?:ab|abc)', 'abc'],
  ['(api|api_key)', 'API_KEY'],
];
interface Piece {
  source: string;
  samples: string[];
  min: number;
  max: number;
}
const piece = fc.tuple(fc.constantFrom(...ATOMS), fc.constantFrom(...QUANTIFIERS)).map(
  ([[atom, samples], [q, min, max]]): Piece =>
    // A quantifier on an assertion is rejected by re2.
    ASSERTIONS.has(atom) ? { source: atom, samples, min: 1, max: 1 } : { source: atom + q, samples, min, max },
);
const pattern = fc
  .tuple(
    fc.boolean(),
    fc.array(piece, { maxLength: 3 }),
    fc.constantFrom(...LITERALS),
    fc.array(piece, { maxLength: 4 }),
  )
  .map(([fold, before, [literal, sample], after]) => {
    const pieces = [...before, { source: literal, samples: [sample], min: 1, max: 1 }, ...after];
    return { source: `${fold ? '(?i)' : ''}${pieces.map((p) => p.source).join('')}`, pieces, fold };
  })
  .filter(({ source }) => {
    try {
      new RE2(source, 'gu');
      return true;
    } catch {
      return false;
    }
  });
type Pattern = { source: string; pieces: Piece[]; fold: boolean };

/** A small deterministic generator, so that fast-check's seed decides every choice. */
function rng(seed: number): (n: number) => number {
  let s = seed >>> 0;
  return (n) => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return (s >>> 8) % n;
  };
}
/** A string the pattern may match: each piece's samples, repeated as its quantifier allows, folded. */
function sample(p: Pattern, seed: number): string {
  const r = rng(seed);
  let out = '';
  for (const piece of p.pieces) {
    const times = piece.min + r(piece.max - piece.min + 1);
    for (let i = 0; i < times; i++) out += piece.samples[r(piece.samples.length)];
  }
  if (!p.fold) return out;
  let folded = '';
  for (const ch of out) {
    const v = r(4);
    if (ch === 'k' && v === 0) folded += '\u212a';
    else if (ch === 's' && v === 0) folded += '\u017f';
    else folded += v === 1 ? ch.toUpperCase() : ch;
  }
  return folded;
}
const FILLER = [
  'ab',
  'ABA',
  ' ',
  '  ',
  '\n',
  ':',
  '-',
  '_',
  '.',
  '0',
  '7',
  'a',
  'k',
  's',
  'x',
  'A',
  'é',
  '\u00a0',
  '日本',
  'zzzzzzzz',
  '--------',
];
/** Texts for a pattern: its samples whole, cut short (near misses), and filler between them. */
function textFor(p: Pattern) {
  return fc
    .array(fc.tuple(fc.integer({ min: 0, max: 2 }), fc.integer(), fc.constantFrom(...FILLER)), { maxLength: 24 })
    .map((parts) =>
      Buffer.from(
        parts
          .map(([kind, seed, filler]) => {
            if (kind === 2) return filler;
            const s = sample(p, seed);
            return kind === 0 ? s : [...s].slice(0, Math.max(0, [...s].length - 1 - (seed & 1))).join('');
          })
          .join(''),
        'utf8',
      ),
    );
}

t.test("property: the windows give exactly the whole view's matches", async (t) => {
  let anchored = 0;
  let matched = 0;
  fc.assert(
    fc.property(
      pattern.chain((p) => fc.tuple(fc.constant(p.source), textFor(p))),
      ([source, view]) => {
        const regex = new RE2(source, 'gu');
        const fast = fastMatches(regex, view, source);
        if (fast === null) return true;
        anchored++;
        const plain = plainMatches(regex, view);
        if (plain.length > 0) matched++;
        if (JSON.stringify(fast) !== JSON.stringify(plain))
          throw new Error(`${source} on ${JSON.stringify(view.toString())}: ${JSON.stringify({ fast, plain })}`);
        return true;
      },
    ),
    { numRuns: 4000 },
  );
  t.ok(anchored > 2000, `most random patterns have an anchor (${anchored})`);
  t.ok(matched > 1000, `and many match the random texts (${matched})`);
});

/**
 * The findings the plain path owes: each pattern alone over the whole view, its distinct values in
 * order, the bound shared out among the patterns that match (patterns.ts, scan).
 */
function reference(list: readonly CustomPattern[], view: Buffer): string[] {
  const values = list.map((p) => {
    const seen: string[] = [];
    for (const m of matches(new RE2(p.pattern, 'gu'), view)) {
      const v = m[0].toString('utf8');
      if (!seen.includes(v)) seen.push(v);
    }
    return seen;
  });
  const share = Math.max(
    1,
    Math.floor(MAX_FINDINGS_PER_INSPECTOR / Math.max(1, values.filter((v) => v.length).length)),
  );
  return values.flatMap((v, i) => v.slice(0, share).map((x) => `${list[i].description} ${redact(x)}`)).sort();
}

t.test(
  'property: a located plan, and a set plan extracting in windows, find what each pattern alone does',
  async (t) => {
    const plans = fc.array(pattern, { minLength: 1, maxLength: 4 }).chain((list) =>
      fc.tuple(
        fc.constant(list.map((p, i): CustomPattern => ({ pattern: p.source, description: `p${i}`, severity: 'warn' }))),
        // Texts that hold samples of every pattern of the plan.
        fc.tuple(...list.map(textFor)).map((views) => Buffer.concat(views)),
      ),
    );
    let located = 0;
    let found = 0;
    fc.assert(
      fc.property(plans, ([list, view]) => {
        const fast = compile(list)!;
        // Located as a large view would be (LOCATED_FROM_BYTES), on these small ones.
        const locatedHits = fast.located
          ? {
              patterns: list.map((_, i) => i),
              prefilters: null,
              located: fast.patterns.map((p) => locate(view, p.anchor!)),
            }
          : undefined;
        // The set pass names the candidates; the anchored ones still extract in windows.
        const windowed = compile(list, ['email', 'card'], { located: false })!;
        if (windowed.located || !windowed.set) throw new Error('the set pass should name the candidates');
        if (fast.located) located++;
        const want = JSON.stringify(reference(list, view));
        if (want !== '[]') found++;
        for (const [plan, setHits] of [
          [fast, locatedHits],
          [windowed, undefined],
        ] as const) {
          const got = JSON.stringify(
            scan(view, plan, 'request_body', setHits)
              .map((x) => `${x.description} ${x.match}`)
              .sort(),
          );
          if (got !== want)
            throw new Error(`${JSON.stringify(list)} on ${JSON.stringify(view.toString())}: ${got} vs ${want}`);
        }
        return true;
      }),
      { numRuns: 1500 },
    );
    t.ok(located > 300, `many random plans are located (${located})`);
    t.ok(found > 300, `and find something (${found})`);
  },
);

t.test('from LOCATED_FROM_BYTES the literals replace the set pass, with the same findings', async (t) => {
  t.ok(compile(BENCH_PATTERNS.map((p) => ({ ...p })))!.located, 'the ten, three of them folded, are located');
  const ss = ['(?i)ss', '(?i)kk', '(?i)x', '(?i)caf\u00e9'].map((pattern) => ({
    pattern,
    description: '',
    severity: 'warn' as const,
  }));
  t.notOk(compile(ss)!.located, 'folded literals re2 alone can find (no run without k or s, non-ASCII)');
  const list = BENCH_PATTERNS.filter((p) => !p.pattern.startsWith('(?i)')).map((p) => ({ ...p }));
  const fast = compile(list)!;
  const plain = compile(list, [], { anchors: false })!;
  t.ok(fast.located, 'the case-sensitive bench patterns are located');
  t.notOk(plain.located);
  const hits =
    'acct_12345678, eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJl; db.corp.example.com INC-123456 10.0.0.1 ';
  const filler = 'lorem ipsum dolor sit amet, password is not here; confidential internal? no: ';
  let text = '';
  while (text.length < LOCATED_FROM_BYTES + 4096) text += filler.repeat(50) + hits;
  const view = Buffer.from(text);
  // The clock held still: what is tested is which path runs, not whether a loaded host locates the
  // literals inside their deadline (past it the set pass runs too, and its prefilters with it).
  const real = performance.now;
  const now = real.call(performance);
  performance.now = () => now;
  let located: ReturnType<typeof hits_>;
  try {
    located = hits_(view, fast);
  } finally {
    performance.now = real;
  }
  t.ok(located.located, 'located');
  t.equal(located.prefilters, null, 'no prefilters without the set pass');
  t.notOk(hits_(view.subarray(0, LOCATED_FROM_BYTES - 1), fast).located, 'a smaller view takes the set pass');
  const key = (plan: typeof fast) =>
    scan(view, plan, 'request_body')
      .map((f) => `${f.description} ${f.match}`)
      .sort();
  t.same(key(fast), key(plain));
  t.ok(key(fast).length >= 4);
  const windowed = compile(list, [], { located: false })!;
  t.notOk(hits_(view, windowed).located, 'the set pass names the candidates…');
  t.same(key(windowed), key(plain), '…which extract in windows, with the same findings');
});

t.test(
  'a small view gives locating at least LOCATE_MIN_NS, not 2 ns a byte, before the set pass runs too',
  async (t) => {
    // A clock that moves 5 µs at each look (a scan whose caches hold other work): over a 9 KB view the
    // per-byte bound (18 µs) would give up after a few literals; the floor (0.1 ms) lets all ten finish.
    const plan = compile(BENCH_PATTERNS.map((p) => ({ ...p })))!;
    const view = Buffer.from('lorem ipsum dolor sit amet, nothing to find here. '.repeat(190));
    t.ok(view.length >= LOCATED_FROM_BYTES && view.length * LOCATE_NS_PER_BYTE < LOCATE_MIN_NS);
    const real = performance.now;
    let clock = real.call(performance);
    let looks = 0;
    performance.now = () => {
      looks++;
      return (clock += 0.005);
    };
    try {
      const found = hits_(view, plan);
      t.ok(found.located, 'located');
      t.equal(found.prefilters, null, 'and the set pass did not run');
      t.equal(found.located!.length, plan.patterns.length, 'every literal was looked for');
      t.ok(
        looks * 0.005 * 1e6 > view.length * LOCATE_NS_PER_BYTE,
        `the clock moved past the per-byte bound (${looks} looks)`,
      );
    } finally {
      performance.now = real;
    }
  },
);
