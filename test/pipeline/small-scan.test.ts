import fc from 'fast-check';
import t from 'tap';
import { BENCH_SECRETS, FULL_SET_DOCUMENT } from '../../bench/corpus.ts';
import type { Finding, Phase } from '../../pipeline/finding.ts';
import { InspectionInput } from '../../pipeline/inspection-input.ts';
import { compile as compileModels, permitted } from '../../pipeline/inspectors/model-restriction.ts';
import { needles as secretNeedles, scan as scanSecrets } from '../../pipeline/inspectors/secrets.ts';
import { hits, matches, type PatternPlan, type SetHits } from '../../pipeline/inspectors/patterns.ts';
import { decodedViews, type Span, stringAt, topLevelOf } from '../../pipeline/json-view.ts';
import { normalizedView } from '../../pipeline/normalized-view.ts';
import { compilePlan, PlanCache, runFor, type ScanPlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import type { ModelPolicy, ResolvedPolicy } from '../../pipeline/policy/types.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { findingKey, scanBody } from '../../pipeline/scan.ts';
import { SseJoiner, sseText } from '../../pipeline/sse-text.ts';
import { sseTextReference } from './sse-text.reference.ts';
import { topLevelOfBefore } from './top-level.reference.ts';

// A small scan's fixed costs were cut (docs/decisions.md, "A small scan's fixed cost"): each shortcut
// is checked here against the longer way it replaces, over random small bodies with planted secrets,
// PII, keys, pattern hits, escapes, invisible characters and entities, in both phases.

const policy = policyFromDocument(validatePolicyDocument(structuredClone(FULL_SET_DOCUMENT)));
const plan = compilePlan(policy);
const patternPlan = plan.inspectors.find((p) => p.inspector.id === 'patterns')!.compiled as PatternPlan;
const secrets = Object.freeze([...BENCH_SECRETS]);

const FRAGMENTS = [
  'the build failed because the cache key changed',
  ' re-run it ',
  's3cr3t-db-password-2026',
  'S3CR3T-DB-PASSWORD-2026',
  'xoxb-2231-slack-bot-token-value',
  'vault-root-token-9f8e7d6c',
  'vault\u200b-root-token-9f8e7d6c',
  'jane.doe@example.com',
  'jane.doe\uff20example.com',
  'jane.doe&commat;example.com',
  'jane.doe&#64;example.com',
  '4111 1111 1111 1111',
  '\uff14\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11',
  '123-45-6789',
  'AKIAIOSFODNN7EXAMPLE',
  'sk-ant-api03-Xy7Qp2Lr9Vt4Kw8Zn1Bc6Df3Gh5Jm0Ns',
  'ghp_0123456789abcdefghijABCDEFGHIJ012345',
  'Project Nightingale',
  'INC-123456',
  'password: hunter22x',
  'confidential: internal',
  'db1.corp.example.com',
  '10.1.2.3',
  'acct_123456789',
  'caf\u00e9 na\u0308ive',
  '\u00a0',
  '\\n',
  '\\u0040',
  '\\/',
  '\\\\',
  '"',
  '\n',
  'data: ',
  '&amp;',
];

const text = fc
  .array(fc.integer({ min: 0, max: FRAGMENTS.length - 1 }), { maxLength: 8 })
  .map((ks) => ks.map((k) => FRAGMENTS[k]).join(' '));

/** A small body of one of the shapes a proxy inspects, carrying `content`. */
const body = fc
  .tuple(fc.integer({ min: 0, max: 5 }), text, text, fc.boolean())
  .map(([shape, a, b, raw]) => {
    const s = (x: string) => (raw ? x : JSON.stringify(x).slice(1, -1));
    switch (shape) {
      case 0:
        return `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"${s(a)}"},{"role":"assistant","content":"${s(b)}"}]}`;
      case 1:
        return `{"id":"msg_01","type":"message","role":"assistant","content":[{"type":"text","text":"${s(a)}${s(b)}"}]}`;
      case 2:
        return `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"${s(a)}"},"finish_reason":"stop"}]}`;
      case 3:
        return [a, b]
          .map(
            (x) =>
              `event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":${JSON.stringify(x)}}}\n\n`,
          )
          .join('');
      case 4:
        return `data: {"choices":[{"index":0,"delta":{"content":${JSON.stringify(a)}}}]}\n\ndata: {"choices":[{"index":0,"delta":{"content":${JSON.stringify(b)}}}]}\n\ndata: [DONE]\n\n`;
      default:
        return `${a}\n${b}`;
    }
  })
  .map((s) => Buffer.from(s));

const phase = fc.constantFrom<Phase>('request', 'response');
const RUNS = 400;

/** scanBody as it was: every inspector over one input, the findings kept through one Set from the start. */
function scanAsBefore(scanPlan: ScanPlan, raw: Buffer, p: Phase) {
  const run = runFor(scanPlan, p, secrets.length, 'all', false, false);
  const failures: { inspector: string; reason: string }[] = [];
  const input = new InspectionInput({
    raw,
    phase: p,
    secrets,
    modelsAnywhere: null,
    failures,
    normalizeDecoded: run.normalizeDecoded,
    patterns: run.patterns,
  });
  if (run.joined) input.joined();
  const all: Finding[] = [];
  for (const q of run.inspectors) all.push(...q.inspector.scan(input, q.compiled));
  if (run.normalized) {
    input.normalized();
    input.normalizedJoined();
    for (const q of run.inspectors)
      if (q.inspector.scanNormalized) all.push(...q.inspector.scanNormalized(input, q.compiled));
  }
  const seen = new Set<string>();
  const findings = all.filter((f) => !seen.has(findingKey(f)) && seen.add(findingKey(f)));
  return { findings, failures };
}

t.test('scanBody keeps the same findings, in the same order, as one Set from the start', async (t) => {
  let found = 0;
  fc.assert(
    fc.property(body, phase, (raw, p) => {
      const now = scanBody(plan, { body: raw, phase: p, secrets });
      const before = scanAsBefore(plan, raw, p);
      found += now.findings.length;
      t.same(now, before);
      return JSON.stringify(now) === JSON.stringify(before);
    }),
    { numRuns: RUNS },
  );
  t.ok(found > RUNS, `the bodies carry findings (${found})`);
});

t.test('sseText: a body without `data:` joins nothing and gives up on nothing', async (t) => {
  fc.assert(
    fc.property(body, (raw) => {
      let gaveUp = 0;
      const joiner = new SseJoiner(() => gaveUp++);
      joiner.push(raw);
      joiner.end();
      let gaveUpNow = 0;
      const now = sseText(raw, () => gaveUpNow++);
      const before = joiner.joined();
      return (now === null ? before === null : before !== null && now.equals(before)) && gaveUp === gaveUpNow;
    }),
    { numRuns: RUNS },
  );
  t.pass("the joined text and its give-ups are the joiner's");
});

/** The set pass's result as it was made: a filter and a map per kind of member. */
function setHitsAsBefore(view: Buffer, p: PatternPlan): SetHits {
  const found = p.set!.match(view);
  const n = p.patterns.length;
  const m = n + p.prefilters.length;
  const out: SetHits = {
    patterns: found.filter((i) => i < n),
    prefilters:
      p.prefilters.length > 0 ? new Set(found.filter((i) => i >= n && i < m).map((i) => p.prefilters[i - n])) : null,
  };
  if (p.literalMembers.length > 0)
    out.literals = new Set(found.filter((i) => i >= m).map((i) => p.literalMembers[i - m]));
  return out;
}

t.test('the set pass: the same hits; a view with none holds no match of any pattern', async (t) => {
  const views = (raw: Buffer) => {
    const decoded = decodedViews(raw).decoded;
    return [raw, decoded, normalizedView(decoded)?.bytes, sseText(raw)].filter((v): v is Buffer => !!v);
  };
  let empty = 0;
  fc.assert(
    fc.property(body, (raw) => {
      for (const view of views(raw)) {
        const now = hits(view, patternPlan);
        if (
          JSON.stringify([now, [...(now.prefilters ?? [])], [...(now.literals ?? [])]]) !==
          JSON.stringify([
            setHitsAsBefore(view, patternPlan),
            [...(setHitsAsBefore(view, patternPlan).prefilters ?? [])],
            [...(setHitsAsBefore(view, patternPlan).literals ?? [])],
          ])
        )
          return false;
        if (now.patterns.length > 0) continue;
        empty++;
        // patterns.scan returns at once for such a view: no pattern's own run would have found anything.
        for (const p of patternPlan.patterns) if (!matches(p.regex, view).next().done) return false;
      }
      return true;
    }),
    { numRuns: RUNS },
  );
  t.ok(empty > 0, `views with no candidate were met (${empty})`);
});

t.test("model restriction: a remembered verdict is the globs' own", async (t) => {
  const globs = fc.constantFrom('claude-*', 'gpt-4o*', '*', 'claude-?-opus', '[a-c]*', 'gpt-[0-9]*', 'x\\*y');
  const layers = fc.array(
    fc.record({ mode: fc.constantFrom('allowlist', 'blocklist'), models: fc.array(globs, { maxLength: 3 }) }),
    {
      minLength: 1,
      maxLength: 3,
    },
  );
  const name = fc.oneof(
    fc.constantFrom('claude-sonnet-4-5', 'gpt-4o-mini', 'claude-3-opus', 'x*y', 'a/b', ''),
    fc.string({ maxLength: 12 }),
    fc.string({ minLength: 250, maxLength: 300 }),
  );
  fc.assert(
    fc.property(layers, fc.array(name, { minLength: 1, maxLength: 600 }), (ls, names) => {
      const models = ls.map((l) => ({ ...l, immutable: false })) as ModelPolicy[];
      const memoized = compileModels(models)!;
      for (const n of names) {
        // A plan just compiled has remembered nothing: its verdict is worked out from the globs.
        if (permitted(memoized, n) !== permitted(compileModels(models)!, n)) return false;
        if (permitted(memoized, n) !== permitted(compileModels(models)!, n)) return false;
      }
      return true;
    }),
    { numRuns: 60 },
  );
  t.pass('every verdict as the globs give it');
});

t.test('PlanCache: the same plans, compiled as often, as a cache that reorders on every hit', async (t) => {
  const policies = Array.from({ length: 5 }, (_, i) => ({ ...policy, version: `v${i}` }) as ResolvedPolicy);
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 4 }),
      fc.array(fc.integer({ min: 0, max: 4 }), { maxLength: 40 }),
      (capacity, gets) => {
        let compiled = 0;
        const cache = new PlanCache({ capacity, onCompile: () => compiled++ });
        // The reference: an LRU by insertion order, moved to the end on every hit.
        const lru = new Map<string, ScanPlan>();
        let expected = 0;
        for (const g of gets) {
          const p = policies[g];
          const plan = cache.get(p);
          let want = lru.get(p.version);
          if (want) {
            lru.delete(p.version);
            lru.set(p.version, want);
          } else {
            expected++;
            want = plan;
            lru.set(p.version, plan);
            if (lru.size > capacity) lru.delete(lru.keys().next().value!);
          }
          if (plan !== want || plan.version !== p.version || compiled !== expected) return false;
        }
        return true;
      },
    ),
    { numRuns: 300 },
  );
  t.pass("every plan and compile as the reference's");
});

t.test("secrets: a small view's anchors found in its latin1 text, as in its bytes", async (t) => {
  const secret = fc.oneof(
    fc.constantFrom(
      ...BENCH_SECRETS,
      'Pa\\ss\\nw0rd-2026',
      'p\u00e4ssw\u00f6rd-9876',
      'abcdefgh',
      '--------',
      'a-a-a-a-a-a',
    ),
    fc.string({ minLength: 8, maxLength: 20 }),
  );
  const piece = fc.oneof(
    fc.constantFrom(...FRAGMENTS, 'S3cr3T-dB-pAsSwOrD-2026', '-2026-2026', '-9-9-9', 'A-A-A-A-A-A', '\u00ff\u00fe-'),
    fc.string({ maxLength: 12 }),
  );
  let found = 0;
  fc.assert(
    fc.property(
      fc.array(secret, { minLength: 1, maxLength: 4 }),
      fc.array(piece, { maxLength: 40 }),
      (values, pieces) => {
        const needles = secretNeedles(values);
        const view = Buffer.from(pieces.join(''));
        const toggle = { enabled: true, severity: 'block' as const };
        const asText = scanSecrets(view, toggle, needles, 'request_body', true);
        const asBytes = scanSecrets(view, toggle, needles, 'request_body', false);
        found += asText.length;
        return JSON.stringify(asText) === JSON.stringify(asBytes);
      },
    ),
    { numRuns: 1000 },
  );
  t.ok(found > 20, `the same findings either way (${found})`);
});

t.test('stringAt: a plain ASCII string read from its bytes is what JSON.parse reads', async (t) => {
  const parsed = (body: Buffer, start: number, end: number): string | null => {
    if (body[start] !== 0x22) return null;
    try {
      const v = JSON.parse(body.toString('utf8', start, end));
      return typeof v === 'string' ? v : null;
    } catch {
      return null;
    }
  };
  const bytes = fc.oneof(
    fc.string({ maxLength: 24 }).map((s) => Buffer.from(JSON.stringify(s))),
    fc.uint8Array({ maxLength: 24 }).map((a) => Buffer.from([0x22, ...a, 0x22])),
    fc
      .constantFrom('"claude-sonnet-4-5"', '"gpt-4o"', '"a\\"b"', '"a\tb"', '""', '"', '"x', 'x"', '"\u00e9"')
      .map((s) => Buffer.from(s)),
  );
  let plain = 0;
  fc.assert(
    fc.property(bytes, fc.nat(3), fc.nat(3), (body, cutStart, cutEnd) => {
      const start = Math.min(cutStart, body.length);
      const end = Math.max(start, body.length - cutEnd);
      const want = parsed(body, start, end);
      if (want !== null && /^[\x20-\x7e]*$/.test(want)) plain++;
      return stringAt(body, { start, end }) === want;
    }),
    { numRuns: 3000 },
  );
  t.ok(plain > 30, `the same string or null (${plain} plain ones)`);
});

t.test('topLevelOf: the walk without closures reads every body as the walk before it', async (t) => {
  const member = fc.oneof(
    fc.constantFrom(
      '"model":"claude-sonnet-4-5"',
      '"Model":"gpt-4o"',
      '"MODEL" : "x"',
      '"mod\\u0065l":"esc"',
      '"mo\\"del":"q"',
      '"system":"s\\"t\\\\"',
      '"messages":[{"role":"user","content":"a \\"b\\" c"},{"content":[1,{"x":"]}"}]}]',
      '"max_tokens":1024',
      '"stream":true',
      '"a":{"model":"inner"}',
      '"modèle":"y"',
    ),
    fc
      .tuple(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }))
      .map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`),
  );
  const body = fc
    .tuple(
      fc.array(member, { maxLength: 6 }),
      fc.constantFrom(',', ' , ', ',\n'),
      fc.nat(40),
      fc.string({ maxLength: 3 }),
      fc.boolean(),
    )
    .map(([ms, sep, cut, junk, mangle]) => {
      const s = `${mangle ? ' ' : ''}{${ms.join(sep)}}`;
      // Truncated or with a few bytes put in: bodies no parser accepts must read the same too.
      return Buffer.from(mangle ? s.slice(0, cut) + junk + s.slice(cut) : s);
    });
  const keys = fc.constantFrom(['model'], ['system', 'model'], ['model', 'messages', 'system'], ['modèle']);
  let read = 0;
  fc.assert(
    fc.property(body, keys, fc.boolean(), (b, ks, anyCase) => {
      const spansNow: Span[] = [];
      const spansBefore: Span[] = [];
      const now = topLevelOf(b, ks, anyCase ? spansNow : undefined);
      const before = topLevelOfBefore(b, ks, anyCase ? spansBefore : undefined);
      if (now) read++;
      return JSON.stringify([now, spansNow]) === JSON.stringify([before, spansBefore]);
    }),
    { numRuns: 3000 },
  );
  t.ok(read > 300, `the same spans, or null, for every body (${read} read)`);
});

t.test('sseText: each line reuses the search for the next `data:`, and joins what the reference joins', async (t) => {
  const line = fc.constantFrom(
    'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"sk-ant-"}}',
    'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"api03-Xy7Qp2Lr9Vt4Kw8Zn1Bc6Df3Gh5Jm0Ns"}}',
    'data:{"choices":[{"index":0,"delta":{"content":"jane.doe@"}}]}',
    'data:{"choices":[{"index":0,"delta":{"content":"example.com"}}]}',
    'x data: {"choices":[{"index":0,"delta":{"content":"mid-line"}}]}',
    '\rdata: {"choices":[{"index":1,"delta":{"content":"after a carriage return"}}]}',
    'data: {"delta"}',
    'event: content_block_delta',
    '  "k": 1,',
    '',
    'data:',
    'data: [DONE]',
  );
  const bodies = fc
    .tuple(fc.array(line, { maxLength: 30 }), fc.constantFrom('\n', '\r\n'))
    .map(([ls, nl]) => Buffer.from(ls.join(nl)));
  let joined = 0;
  fc.assert(
    fc.property(bodies, (b) => {
      const now = sseText(b);
      const before = sseTextReference(b);
      if (now) joined++;
      return now === null ? before === null : before !== null && now.equals(before);
    }),
    { numRuns: 2000 },
  );
  t.ok(joined > 200, `the same joined text (${joined} joined)`);
});

t.test('SseJoiner: the stops read with remembered searches are those read line by line', async (t) => {
  // Fed one byte at a time, every line is a buffer of its own: no search can run past it, nothing is
  // remembered across lines. Fed whole, the searches run on and are reused.
  const line = fc.constantFrom(
    'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}',
    'data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"b"}}',
    'data: {"type":"content_block_stop","index":0}',
    'data: {"type":"content_block_stop","index":1}',
    'data: {"type": "ping"}',
    'data: {"type":"response.output_text.delta","item_id":"i","content_index":0,"delta":"c"}',
    'data: {"type":"response.output_text.done","item_id":"i","content_index":0}',
    'data:{"choices":[{"index":0,"delta":{"content":"d"}}]}',
    'data:{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    'data:{"choices":[{"index":0,"finish_reason":"stop"}]}',
    'x content_block_stop .done" finish_reason',
    'data: content_block_stop',
    'event: ping',
    '',
  );
  const bodies = fc.array(line, { maxLength: 40 }).map((ls) => Buffer.from(ls.join('\n')));
  const read = (b: Buffer, step: number) => {
    const joiner = new SseJoiner();
    const stops: string[] = [];
    for (let i = 0; i < b.length; i += step) {
      joiner.push(b.subarray(i, i + step));
      for (const block of joiner.takeStopped()) stops.push(block.key);
    }
    joiner.end();
    for (const block of joiner.takeStopped()) stops.push(block.key);
    return JSON.stringify([stops, joiner.joined()?.toString() ?? null]);
  };
  let stopped = 0;
  fc.assert(
    fc.property(bodies, fc.integer({ min: 2, max: 64 }), (b, step) => {
      const bytewise = read(b, 1);
      if (JSON.parse(bytewise)[0].length > 0) stopped++;
      return read(b, Math.max(1, b.length)) === bytewise && read(b, step) === bytewise;
    }),
    { numRuns: 1500 },
  );
  t.ok(stopped > 200, `the same stops and joined text (${stopped} bodies with stops)`);
});
