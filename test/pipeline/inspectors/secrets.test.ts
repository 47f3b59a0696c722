import t from 'tap';
import { needles, scan } from '../../../pipeline/inspectors/secrets.ts';
import { scanView } from '../../../pipeline/json-view.ts';

const toggle = { enabled: true, severity: 'block' as const };
const find = (body: string, secrets: string[]) =>
  scan(scanView(Buffer.from(body)), toggle, needles(secrets), 'response_body');

t.test('raw and JSON-escaped forms are found, redacted', async (t) => {
  const secret = 'p@ss"word\\with\nodd chars';
  const body = JSON.stringify({ messages: [{ role: 'user', content: `here: ${secret}` }] });
  t.notOk(body.includes(secret), 'the body carries only the escaped form');
  const f = find(body, [secret]);
  t.same(f, [
    {
      inspector_type: 'secrets',
      severity: 'block',
      description: "value of one of the agent's secrets",
      match: 'p@ss****',
      location: 'response_body',
    },
  ]);
  t.equal(find(`plain text ${secret}`, [secret]).length, 1, 'raw form in a non-JSON body');
  t.equal(
    find(JSON.stringify({ a: JSON.stringify({ b: secret }) }), [secret]).length,
    1,
    'double-encoded (tool arguments)',
  );
  t.equal(find('{"c":"\\u0068unter2hunter2"}', ['hunter2hunter2']).length, 1, 'unicode-escaped');
});

t.test('values under 8 characters are not scanned; a value never appears in a finding', async (t) => {
  t.same(find('the pin is 1234567 ok', ['1234567']), []);
  const f = find('token=ABCDEFGH12345678', ['ABCDEFGH12345678', 'ABCDEFGH12345678']);
  t.equal(f.length, 1, 'duplicates count once');
  t.notMatch(JSON.stringify(f), /EFGH1234/);
  t.equal(f[0].match, 'ABCD****');
});

t.test('non-ASCII secrets redact by character', async (t) => {
  const f = find('{"c":"Пароль-секрет-2026"}', ['Пароль-секрет-2026']);
  t.equal(f[0].match, 'Паро****');
});

t.test('a secret is found in any letter case (docs/decisions.md, "Evasion: the normalized view")', async (t) => {
  t.equal(find('{"c":"HUNTER2HUNTER2"}', ['hunter2hunter2']).length, 1, 'upper case');
  t.equal(find('{"c":"hUnTeR2-hUnTeR2"}', ['Hunter2-Hunter2']).length, 1, 'mixed case');
  t.equal(
    find('say CORRECTHORSEBATTERY', ['correcthorsebattery']).length,
    1,
    'a value with no digit or sign to anchor on',
  );
  t.equal(find('{"c":"ПАРОЛЬ-СЕКРЕТ-2026"}', ['Пароль-секрет-2026']).length, 1, 'Unicode letters');
  t.equal(find('κωδικος-μυστικος', ['ΚΩΔΙΚΟΣ-ΜΥΣΤΙΚΟΣ']).length, 1, 'final sigma');
  t.equal(find('{"c":"P@SS\\"WORD"}', ['p@ss"word']).length, 1, 'JSON-escaped form in another case');
  t.same(find('HUNTER2-HUNTER and hunter2hunter', ['hunter2hunter2']), [], 'part of it is no match');
  t.equal(
    find('x'.repeat(10) + 'HUNTER2HUNTER2', ['hunter2hunter2'])[0].match,
    'hunt****',
    "the match is the secret's own redaction",
  );
});

t.test('an anchor that hits everywhere falls back to folding the view, and still finds the value', async (t) => {
  // `-` is the longest caseless run of the value: 200,000 hits cost more than folding once.
  const body = '-a'.repeat(200_000) + 'AB-CDEFGH';
  t.equal(find(body, ['ab-cdefgh']).length, 1);
  t.same(find('-a'.repeat(200_000), ['ab-cdefgh']), []);
});
