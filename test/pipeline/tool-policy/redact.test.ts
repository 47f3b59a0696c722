import t from 'tap';
import fc from 'fast-check';
import { MAX_STORED_ARGUMENT_BYTES, redactArguments } from '../../../pipeline/tool-policy/redact.ts';

const SECRET = 'hunter2-agent-secret-value';
const KEY = 'sk-ant-api03-abcdefghij0123456789KLMNOP';

t.test('every detector: replaced by its first 4 characters and ****, the rest as sent', async (t) => {
  const text = JSON.stringify({
    to: 'jane.doe@example.com',
    card: '4111 1111 1111 1111',
    ssn: '123-45-6789',
    note: `use ${KEY} and ${SECRET}`,
    amount: 900,
  });
  const out = redactArguments(text, [SECRET, 'short']);
  t.equal(
    out,
    JSON.stringify({
      to: 'jane****',
      card: '4111****',
      ssn: '123-****',
      note: 'use sk-a**** and hunt****',
      amount: 900,
    }),
  );
  t.equal(redactArguments('{"a": 1,  "b": "plain"}', [SECRET]), '{"a": 1,  "b": "plain"}', 'nothing found: as sent');
  t.equal(redactArguments('{"p":"short"}', ['short']), '{"p":"short"}', 'secrets under 8 characters are not needles');
});

t.test('secrets in any letter case, JSON-escaped, or hidden behind escapes', async (t) => {
  t.equal(redactArguments(`{"p":"${SECRET.toUpperCase()}"}`, [SECRET]), '{"p":"hunt****"}');
  const quoted = 'pa"ss\\word-123';
  t.equal(
    redactArguments(JSON.stringify({ p: quoted }), [quoted]),
    '{"p":"pa\\"s****"}',
    'the redaction is escaped in JSON',
  );
  // `\u0068unter2…` is the secret once decoded: the arguments are re-serialized with it redacted.
  const hidden = `{"p":"\\u0068${SECRET.slice(1)}","n":1}`;
  const out = redactArguments(hidden, [SECRET]);
  t.notMatch(out, /unter2-agent/);
  t.same(JSON.parse(out), { p: 'hunt****', n: 1 });
  // An escaped @ hides an email from a scan of the text as sent.
  const email = redactArguments('{"to":"bob\\u0040example.com"}', []);
  t.same(JSON.parse(email), { to: 'bob@****' });
  // Keys too.
  t.same(JSON.parse(redactArguments(JSON.stringify({ [SECRET]: 1 }), [SECRET])), { 'hunt****': 1 });
});

t.test('text that is not JSON is redacted as text', async (t) => {
  t.equal(redactArguments(`rm -rf / # ${SECRET} mail bob@example.com`, [SECRET]), 'rm -rf / # hunt**** mail bob@****');
});

t.test('capped at 16 KiB of UTF-8, on a character, saying so', async (t) => {
  const big = JSON.stringify({ blob: 'é'.repeat(20_000) });
  const out = redactArguments(big, []);
  t.ok(Buffer.byteLength(out) <= MAX_STORED_ARGUMENT_BYTES);
  t.match(out, /…\[dvx: truncated, \d+ bytes in all\]$/);
  t.notMatch(out, /\ufffd/, 'no character cut in half');
  // A secret straddling the cut is redacted before the cut, never half-kept.
  const straddle = `${'x'.repeat(MAX_STORED_ARGUMENT_BYTES - 40)}${SECRET}${'y'.repeat(100)}`;
  t.notMatch(redactArguments(straddle, [SECRET]), /hunter2-/);
  t.equal(
    redactArguments('x'.repeat(MAX_STORED_ARGUMENT_BYTES), []).length,
    MAX_STORED_ARGUMENT_BYTES,
    'at the cap: kept',
  );
});

t.test('hostile shapes: deep nesting, __proto__, huge numbers', async (t) => {
  const deep = `${'['.repeat(100_000)}"${SECRET}"${']'.repeat(100_000)}`;
  t.notMatch(redactArguments(deep, [SECRET]), /hunter2-/, 'too deep to parse: redacted as text');
  t.equal(redactArguments('{"__proto__":{"a":1e400}}', []), '{"__proto__":{"a":1e400}}');
  const escapedProto = redactArguments(`{"__proto__":{"k":"\\u0068${SECRET.slice(1)}"}}`, [SECRET]);
  t.same(JSON.parse(escapedProto), JSON.parse('{"__proto__":{"k":"hunt****"}}'), '__proto__ stays a key');
  t.equal(({} as Record<string, unknown>).k, undefined);
});

t.test('property: a secret never survives, wherever it is put', async (t) => {
  fc.assert(
    fc.property(fc.jsonValue(), fc.boolean(), (v, upper) => {
      const s = upper ? SECRET.toUpperCase() : SECRET;
      const text = JSON.stringify({ v, s, [s]: [v, `pre ${s} post`] });
      const out = redactArguments(text, [SECRET]);
      return !out.toLowerCase().includes(SECRET.toLowerCase()) && Buffer.byteLength(out) <= MAX_STORED_ARGUMENT_BYTES;
    }),
  );
  fc.assert(
    fc.property(fc.string({ unit: 'binary' }), (s) => {
      const out = redactArguments(s, [SECRET]);
      return typeof out === 'string' && Buffer.byteLength(out) <= MAX_STORED_ARGUMENT_BYTES;
    }),
  );
  t.pass('no secret, always bounded');
});
