import t from 'tap';
import fc from 'fast-check';
import { createHash } from 'node:crypto';
import { compileToolPolicy, type InspectionPolicy } from '../../../pipeline/tool-policy/compile.ts';
import { evaluateToolCall } from '../../../pipeline/tool-policy/evaluate.ts';
import { canonicalJson, parseArguments } from '../../../pipeline/tool-policy/arguments.ts';

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

const POLICY: InspectionPolicy = {
  inspectors: [
    {
      name: 'payments',
      rules: [
        {
          tool: 'transfer*',
          verdict: 'require_approval',
          summary: 'Large transfers need a person',
          arg_gt: { amount: 500 },
        },
        { tool: 'transfer_all', verdict: 'deny', summary: 'Never empty an account' },
      ],
    },
    {
      rules: [
        { tool: 'get_*', verdict: 'allow' },
        { tool: 'rm', verdict: 'deny', model_match: 'gpt-*' },
      ],
    },
  ],
};
const policy = compileToolPolicy(POLICY)!;
const call = (name: string, args: unknown, model: string | null = 'claude-sonnet-4-5') =>
  evaluateToolCall(policy, { name, arguments: typeof args === 'string' ? args : JSON.stringify(args), model });

t.test('compiling: null without rules, a version of the content, cached', async (t) => {
  t.equal(compileToolPolicy(null), null);
  t.equal(compileToolPolicy(undefined), null);
  t.equal(compileToolPolicy({ inspectors: [] }), null);
  t.equal(compileToolPolicy({ inspectors: [{ name: 'x', rules: [] }] }), null, 'inspectors without rules: no policy');
  t.match(policy.version, /^[0-9a-f]{16}$/);
  t.equal(policy.version, sha(canonicalJson(POLICY)).slice(0, 16));
  t.equal(compileToolPolicy(POLICY), policy, 'the same object: the same compiled policy');
  const copy = JSON.parse(JSON.stringify(POLICY)) as InspectionPolicy;
  t.equal(compileToolPolicy(copy), policy, 'equal content: cached by content');
  // Key order is not content: the version is of the canonical JSON.
  const reordered = {
    inspectors: POLICY!.inspectors.map((i) => ({ rules: i.rules, ...(i.name ? { name: i.name } : {}) })),
  };
  t.equal(compileToolPolicy(reordered)!.version, policy.version);
  const changed = { inspectors: [{ rules: [{ tool: 'a', verdict: 'deny' }] }] };
  t.not(compileToolPolicy(changed)!.version, policy.version);
  t.same(
    policy.rules.map((r) => [r.name, r.inspector]),
    [
      ['payments.rules[0]', 'payments'],
      ['payments.rules[1]', 'payments'],
      ['inspectors[1].rules[0]', 'inspectors[1]'],
      ['inspectors[1].rules[1]', 'inspectors[1]'],
    ],
  );
});

t.test('tool globs, arg_gt, strictest verdict, no match', async (t) => {
  const small = call('transfer', { amount: 20 });
  t.equal(small.verdict, 'allow');
  t.equal(small.rule, null);
  t.equal(small.inspector, null);
  t.match(small.reason, /no rule .* matches the tool "transfer"/);
  t.equal(small.argsParsed, true);

  const large = call('transfer', { amount: 900, to: 'x' });
  t.equal(large.verdict, 'require_approval');
  t.equal(large.rule, 'payments.rules[0]');
  t.equal(large.inspector, 'payments');
  t.equal(large.summary, 'Large transfers need a person');
  t.equal(
    large.reason,
    'held for approval by rule payments.rules[0] (Large transfers need a person): amount is 900, greater than 500',
  );
  t.equal(call('transfer', { amount: 500 }).verdict, 'allow', 'greater than, not equal');

  const all = call('transfer_all', { amount: 900 });
  t.equal(all.verdict, 'deny', 'deny beats require_approval');
  t.equal(all.rule, 'payments.rules[1]');

  const weather = call('get_weather', { city: 'Paris' });
  t.equal(weather.verdict, 'allow');
  t.equal(weather.rule, 'inspectors[1].rules[0]', 'a matching allow rule is named');
  t.equal(weather.inspector, 'inspectors[1]');
  t.equal(call('get/weather', {}).verdict, 'allow');
  t.equal(call('get/weather', {}).rule, null, '* does not cross a slash (path.Match)');
});

t.test('model_match narrows a rule; an unknown model meets it (fail closed)', async (t) => {
  t.equal(call('rm', {}, 'gpt-4o').verdict, 'deny');
  t.equal(call('rm', {}, 'claude-opus-4').verdict, 'allow');
  const unknown = call('rm', {}, null);
  t.equal(unknown.verdict, 'deny');
  t.match(unknown.reason, /names no model/);
  t.equal(call('rm', {}, '').verdict, 'deny');
});

t.test('arguments that are not an object meet every arg_gt, and the reason says so', async (t) => {
  for (const [text, problem] of [
    ['{"amount": 9', /do not parse as JSON/],
    ['', /do not parse as JSON/],
    ['[900]', /are not a JSON object/],
    ['"amount"', /are not a JSON object/],
    ['null', /are not a JSON object/],
    [`${'['.repeat(100_000)}${']'.repeat(100_000)}`, /nest deeper than 64 levels/],
    [`{"a":${'{"a":'.repeat(70)}1${'}'.repeat(71)}`, /nest deeper than 64 levels/],
  ] as const) {
    const e = call('transfer', text);
    t.equal(e.verdict, 'require_approval', text.slice(0, 20));
    t.equal(e.argsParsed, false);
    t.match(e.reason, problem);
    t.match(e.reason, /fail closed/);
    t.equal(e.argsDigest, sha(text), 'digested as raw text');
  }
  // A rule without arg_gt needs no arguments: unparseable ones still match on the tool alone.
  t.equal(call('transfer_all', '{').verdict, 'deny');
  t.equal(call('get_weather', '{').verdict, 'allow');
});

t.test('arg_gt: numbers only, dotted paths, own keys, attacker-shaped arguments', async (t) => {
  const nested = compileToolPolicy({
    inspectors: [{ name: 'n', rules: [{ tool: 'pay', verdict: 'deny', arg_gt: { 'payment.amount': 100, fee: 1 } }] }],
  })!;
  const ev = (args: string) => evaluateToolCall(nested, { name: 'pay', arguments: args, model: 'm' }).verdict;
  t.equal(ev('{"payment":{"amount":101},"fee":2}'), 'deny', 'each bound met');
  t.equal(ev('{"payment":{"amount":101},"fee":1}'), 'allow', 'one bound not met: no match');
  t.equal(ev('{"payment":{"amount":101}}'), 'allow', 'a missing argument is not greater');
  // A number written as text counts: the tools' parsers coerce it (pydantic, zod's coerce).
  t.equal(ev('{"payment":{"amount":"500"},"fee":2}'), 'deny', 'a string "500" is 500');
  t.equal(ev('{"payment":{"amount":" 1e6 "},"fee":"2"}'), 'deny', 'exponent, spaces, every bound');
  t.equal(ev('{"payment":{"amount":"1_000"},"fee":2}'), 'deny', 'digit separators (Python int())');
  t.equal(ev('{"payment":{"amount":"Infinity"},"fee":2}'), 'deny');
  t.equal(ev('{"payment":{"amount":"50"},"fee":2}'), 'allow', 'under the bound');
  t.equal(ev('{"payment":{"amount":"500 USD"},"fee":2}'), 'allow', 'not a number');
  t.equal(ev('{"payment":{"amount":"0x1F4"},"fee":2}'), 'allow', 'hex is not read as decimal');
  t.equal(ev('{"payment":{"amount":true},"fee":2}'), 'allow');
  t.equal(ev('{"payment":{"amount":[500]},"fee":2}'), 'allow');
  t.equal(ev('{"payment":{"amount":1e400},"fee":2}'), 'deny', '1e400 parses to Infinity: greater');
  t.equal(ev('{"payment":{"amount":-1e400},"fee":2}'), 'allow', '-Infinity is not');
  t.equal(ev('{"payment":{"amount":123456789012345678901234567890},"fee":2}'), 'deny');
  t.equal(ev('{"payment.amount":101,"fee":2}'), 'deny', 'a key holding the dot is read too');
  t.equal(ev('{"payment":{"amount":1},"payment.amount":101,"fee":2}'), 'deny', 'any reading past the bound');
  t.equal(ev('{"\\u0070ayment":{"\\u0061mount":101},"f\\u0065e":2}'), 'deny', 'escaped keys are their characters');
  t.equal(ev('{"payment":{"amount":5,"amount":101},"fee":2}'), 'deny', 'a repeated key: the last one, as JSON.parse');

  const proto = compileToolPolicy({
    inspectors: [{ rules: [{ tool: '*', verdict: 'deny', arg_gt: { '__proto__.x': 1, 'constructor.length': -1 } }] }],
  })!;
  const pe = (args: string) => evaluateToolCall(proto, { name: 't', arguments: args, model: 'm' }).verdict;
  t.equal(pe('{}'), 'allow', 'inherited members are never read');
  t.equal(pe('{"__proto__":{"x":2},"constructor":{"length":0}}'), 'deny', 'own keys named like members are read');
  t.equal(({} as Record<string, unknown>).x, undefined, 'nothing leaked into Object.prototype');
  const arrays = compileToolPolicy({
    inspectors: [{ rules: [{ verdict: 'deny', arg_gt: { 'items.1.price': 10 } }] }],
  })!;
  t.equal(
    evaluateToolCall(arrays, { name: 'any', arguments: '{"items":[{"price":1},{"price":11}]}', model: null }).verdict,
    'deny',
    'array elements by index; a rule without tool matches every tool',
  );
});

t.test('rules the evaluator cannot read fail closed', async (t) => {
  const odd = compileToolPolicy({
    inspectors: [
      {
        name: 'odd',
        rules: [
          { tool: 'a' },
          { tool: 'b', verdict: 'block' },
          { tool: '[', verdict: 'allow' },
          { tool: 'c', verdict: 'allow', arg_gt: { n: 'x' as unknown as number } },
        ],
      },
    ],
  })!;
  const ev = (name: string) => evaluateToolCall(odd, { name, arguments: '{}', model: 'm' });
  t.equal(ev('a').verdict, 'deny');
  t.match(ev('a').reason, /names no verdict \(treated as deny\)/);
  t.equal(ev('b').verdict, 'deny');
  t.match(ev('b').reason, /verdict "block" is unknown/);
  // A malformed glob matches every call: its own verdict applies to all of them.
  const malformedAllow = ev('zzz');
  t.equal(malformedAllow.rule, 'odd.rules[2]');
  t.match(malformedAllow.reason, /malformed, so it matches every call/);
  t.match(ev('c').rule!, /^odd\.rules\[2\]$/, 'the first of equal verdicts is named');
});

t.test('digest: canonical JSON of the parsed arguments', async (t) => {
  const a = parseArguments('{ "b": 1, "a": [true, null, "x"] }');
  t.equal(a.digest, sha('{"a":[true,null,"x"],"b":1}'));
  t.equal(parseArguments('{"a":[true,null,"x"],"b":1}').digest, a.digest, 'whitespace and key order do not count');
  t.equal(parseArguments('{"\\u0061":"\\u00e9"}').digest, parseArguments('{"a":"é"}').digest, 'escapes decoded');
  t.not(parseArguments('{"a":1e400}').digest, parseArguments('{"a":null}').digest, 'Infinity is not null');
  t.not(parseArguments('{"a":1.0}').digest, parseArguments('{"a":1}').digest, 'numbers as written');
  t.not(
    parseArguments('{"a":9007199254740993}').digest,
    parseArguments('{"a":9007199254740992}').digest,
    'integers past 2^53 as written',
  );
  t.equal(parseArguments('{"a":1e400}').digest, sha('{"a":1e400}'));
  t.equal(parseArguments('{"__proto__":{"x":1}}').digest, sha('{"__proto__":{"x":1}}'), '__proto__ is a key');
});

t.test(
  'property: the verdict is the strictest matching rule (a model of the semantics), in any rule order',
  async (t) => {
    const rule = fc.record({
      tool: fc.option(fc.constantFrom('a', 'b', '*', 'a*', '?'), { nil: undefined }),
      verdict: fc.constantFrom('allow', 'deny', 'require_approval'),
      arg_gt: fc.option(fc.dictionary(fc.constantFrom('x', 'y', 'z.w'), fc.integer({ min: -5, max: 5 })), {
        nil: undefined,
      }),
    });
    const value = fc.oneof(fc.integer({ min: -8, max: 8 }), fc.constant('3'), fc.constant(null));
    const args = fc.oneof(
      fc.record({ x: value, y: value, z: fc.record({ w: value }) }, { requiredKeys: [] }),
      fc.constantFrom('{', '[1]', ''),
    );
    const rank = { allow: 0, require_approval: 1, deny: 2 } as const;
    const globs: Record<string, (n: string) => boolean> = {
      a: (n) => n === 'a',
      b: (n) => n === 'b',
      '*': () => true,
      'a*': (n) => n.startsWith('a'),
      '?': (n) => n.length === 1,
    };
    fc.assert(
      fc.property(
        fc.array(rule, { minLength: 1, maxLength: 8 }),
        fc.constantFrom('a', 'b', 'ab', 'c'),
        args,
        (rules, name, a) => {
          const text = typeof a === 'string' ? a : JSON.stringify(a);
          const parsed = typeof a === 'string' ? null : (a as Record<string, unknown>);
          const at = (path: string) => {
            if (parsed === null) return undefined;
            if (path === 'z.w') return (parsed.z as Record<string, unknown> | undefined)?.w;
            return parsed[path];
          };
          // The model: tool glob, then each bound a number (or decimal text) strictly past it (not-an-object meets all).
          const matching = rules.filter(
            (r) =>
              (r.tool === undefined || globs[r.tool](name)) &&
              Object.entries(r.arg_gt ?? {}).every(([path, bound]) => {
                if (parsed === null) return true;
                const v = at(path);
                const n = typeof v === 'string' && /^\s*-?\d+(\.\d+)?\s*$/.test(v) ? Number(v) : v;
                return typeof n === 'number' && n > bound;
              }),
          );
          const expected = matching.reduce<'allow' | 'deny' | 'require_approval'>(
            (best, r) => (rank[r.verdict] > rank[best] ? r.verdict : best),
            'allow',
          );
          for (const order of [rules, [...rules].reverse()]) {
            const e = evaluateToolCall(compileToolPolicy({ inspectors: [{ name: 'p', rules: order }] })!, {
              name,
              arguments: text,
              model: 'm',
            });
            if (e.verdict !== expected) return false;
            if ((e.rule === null) !== (matching.length === 0)) return false;
            if (e.rule !== null && order[Number(/\[(\d+)\]$/.exec(e.rule)![1])].verdict !== e.verdict) return false;
          }
          return true;
        },
      ),
    );
    t.pass('matches the model');
  },
);

t.test('property: the digest ignores key order and whitespace, and any text evaluates without throwing', async (t) => {
  fc.assert(
    fc.property(fc.jsonValue(), (v) => {
      const text = JSON.stringify(v);
      const spaced = JSON.stringify(v, null, 2);
      return parseArguments(text).digest === parseArguments(spaced).digest;
    }),
  );
  fc.assert(
    fc.property(fc.string(), fc.string(), (name, args) => {
      const e = evaluateToolCall(policy, { name, arguments: args, model: 'm' });
      return ['allow', 'deny', 'require_approval'].includes(e.verdict) && /^[0-9a-f]{64}$/.test(e.argsDigest);
    }),
  );
  t.pass('no input throws');
});
