import t from 'tap';
import { compile, scan } from '../../../pipeline/inspectors/api-key.ts';
import { scanView } from '../../../pipeline/json-view.ts';

const plan = compile({ enabled: true, severity: 'block' })!;
const found = (text: string) =>
  scan(scanView(Buffer.from(text)), plan, 'request_body').map((f) => `${f.description}|${f.match}`);

const KEYS: [string, string][] = [
  ['AKIAIOSFODNN7EXAMPLE', 'AWS access key ID'],
  ['AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q', 'Google API key'],
  ['ghp_1234567890abcdefghijklmnopqrstuvwxyz', 'GitHub token'],
  ['ghs_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789', 'GitHub token'],
  [
    'github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcd',
    'GitHub fine-grained personal access token',
  ],
  ['sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdEf', 'Anthropic API key'],
  ['sk-proj-AbCdEfGhIjKlMnOpQrSt1234567890', 'secret key (sk-)'],
  ['sk-AbCdEfGhIjKlMnOpQrSt1234567890abcdefghijklmnop', 'secret key (sk-)'],
  ['sk_test_4eC39HqLyjWDarjtT1zdp7dc', 'Stripe secret key (test)'],
  ['sk_live_4eC39HqLyjWDarjtT1zdp7dc', 'Stripe secret key (live)'],
  ['pk_test_TYooMQauvdEDq54NiTphI7jx', 'Stripe publishable key (test)'],
  ['pk_live_TYooMQauvdEDq54NiTphI7jx', 'Stripe publishable key (live)'],
];

t.test('each of the 11 prefixes with a plausible body', async (t) => {
  for (const [key, description] of KEYS) {
    t.same(found(`export KEY=${key}\n`), [`${description}|${key.slice(0, 4)}****`], description);
    t.same(
      found(JSON.stringify({ messages: [{ content: `use "${key}" please` }] })),
      [`${description}|${key.slice(0, 4)}****`],
      `${description} in JSON`,
    );
  }
});

t.test('sk-ant- is reported once, never again as sk-', async (t) => {
  const f = found('key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 end');
  t.equal(f.length, 1);
  t.match(f[0], /^Anthropic API key/);
});

t.test('bare prefixes and near misses in prose are not findings', async (t) => {
  for (const prose of [
    'OpenAI keys start with sk- and Anthropic ones with sk-ant-.',
    'use the sk-learn-compatible-estimator-interface-here',
    'AKIA is the prefix of AWS access keys',
    'AKIAIOSFODNN7EXAMPL', // 15 body chars
    'AKIAIOSFODNN7EXAMPLEX', // 17: part of something longer
    'task-1234567890abcdefghijklmnop', // "sk-" inside a word
    'ghp_short',
    'the pk_test_ prefix',
    'sk_live_ONLYLETTERSNODIGITSHEREATALL',
    'my github_pat_ is secret',
  ]) {
    t.same(found(prose), [], prose);
  }
});

t.test('escaped keys are found in the decoded view', async (t) => {
  t.same(found('{"c":"\\u0073k-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"}'), ['Anthropic API key|sk-a****']);
  t.same(found('{"c":"line\\nAKIAIOSFODNN7EXAMPLE\\n"}'), ['AWS access key ID|AKIA****']);
});

t.test('disabled is no plan', async (t) => {
  t.equal(compile({ enabled: false, severity: 'block' }), null);
});

t.test('a prefix flood is one run: skipped whole, and a key after it is still found', async (t) => {
  for (const [flood, key] of [
    ['AKIA', 'AKIAIOSFODNN7EXAMPLE'],
    ['sk-', 'sk-proj-AbCdEfGhIjKlMnOpQrSt1234567890'],
    ['ghp_', 'ghp_1234567890abcdefghijklmnopqrstuvwxyz'],
    ['AIza', 'AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q'],
    ['sk_test_', 'sk_test_4eC39HqLyjWDarjtT1zdp7dc'],
  ]) {
    t.same(
      found(flood.repeat(50_000) + ' ' + key).map((f) => f.split('|')[1]),
      [key.slice(0, 4) + '****'],
      flood,
    );
    t.same(found(flood.repeat(1000) + key), [], `${flood}: glued to the flood, no key starts there`);
  }
  // A hit that is itself the letter of an escape can have a key start right after it.
  t.same(found('x \\-sk-proj-AbCdEfGhIjKlMnOpQrSt1234567890'), ['secret key (sk-)|sk-p****']);
  t.same(found('x \\_ghp_1234567890abcdefghijklmnopqrstuvwxyz'), ['GitHub token|ghp_****']);
});
