import t from 'tap';
import fc from 'fast-check';
import { compile, isCardNumber, isSsn, luhnValid, scan } from '../../../pipeline/inspectors/pii.ts';
import { scanView } from '../../../pipeline/json-view.ts';

const ALL = compile({ enabled: true, severity: 'warn', types: null })!;
const find = (text: string, plan = ALL) => scan(scanView(Buffer.from(text)), plan, 'request_body');
const matches = (text: string, plan = ALL) => find(text, plan).map((f) => `${f.description}|${f.match}`);

t.test('emails', async (t) => {
  t.same(matches('write to jane.doe+tag@mail.example.co.uk now'), ['email address|jane****']);
  t.same(
    matches(JSON.stringify({ content: 'ping bob@example.com.' })),
    ['email address|bob@****'],
    'trailing dot is not part of it',
  );
  t.same(
    matches('{"c":"x\\u0040y.example.org alice\\u0040corp.io"}'),
    ['email address|x@y.****', 'email address|alic****'],
    'escaped @ is still found',
  );
  for (const miss of [
    'user@localhost',
    '@mention',
    'a@b.c',
    'foo@bar.123',
    'name@.com',
    'me@example..com',
    'x@-a.com',
  ]) {
    t.same(matches(miss), [], `near miss: ${miss}`);
  }
});

t.test('credit cards: 13–19 digits, spaces or dashes, Luhn', async (t) => {
  for (const card of [
    '4111111111111111',
    '4111 1111 1111 1111',
    '4111-1111-1111-1111',
    '378282246310005',
    '5555555555554444',
    '6011111111111117',
    '30569309025904',
    '4222222222222',
    '6200000000000005',
    '3530111333300000',
  ]) {
    t.same(matches(`card: ${card}.`), [`credit card number|${card.slice(0, 4)}****`], card);
  }
  for (const miss of [
    '4111111111111112',
    '4111 1111 1111 1112',
    '1700000000000',
    '0000000000000000',
    '411111111111',
    '41111111111111111111',
    'id4111111111111111',
    '4111111111111111abc',
    '4111  1111  1111  1111',
  ]) {
    t.same(matches(`x ${miss} x`), [], `near miss: ${miss}`);
  }
  t.same(
    matches('cards 4111 1111 1111 1111 5555 5555 5555 4444 end'),
    ['credit card number|4111****', 'credit card number|5555****'],
    'two grouped cards in one run',
  );
  t.same(
    matches('{"n":"\\u0034111111111111111"}'),
    ['credit card number|4111****'],
    'an escaped digit does not hide it',
  );
});

t.test('SSNs: XXX-XX-XXXX with the SSA rules', async (t) => {
  t.same(matches('ssn 123-45-6789 on file'), ['US social security number|123-****']);
  t.same(
    matches('a 123-45-6789 234-56-7890 b'),
    ['US social security number|123-****', 'US social security number|234-****'],
    'two in one run',
  );
  for (const miss of [
    '000-12-3456',
    '666-12-3456',
    '900-12-3456',
    '999-12-3456',
    '123-00-4567',
    '123-45-0000',
    '123456789',
    '123-45-67890',
    '1123-45-6789',
    'a123-45-6789',
    '123 45 6789',
    '123-45-6789-1',
  ]) {
    t.same(matches(`x ${miss} x`), [], `near miss: ${miss}`);
  }
});

t.test('types filter', async (t) => {
  const emailOnly = compile({ enabled: true, severity: 'block', types: ['email'] })!;
  t.same(matches('a@example.com 4111111111111111 123-45-6789', emailOnly), ['email address|a@ex****']);
  t.equal(find('a@example.com', emailOnly)[0].severity, 'block');
  t.equal(compile({ enabled: false, severity: 'warn', types: null }), null);
  const redact = compile({ enabled: true, severity: 'redact', types: null })!;
  t.equal(find('a@example.com', redact)[0].severity, 'warn', 'redact is recorded as warn');
});

t.test('every position of a card or SSN in the body is found (stride probing)', async (t) => {
  fc.assert(
    fc.property(
      fc.nat(200),
      fc.nat(200),
      fc.constantFrom('4111111111111111', '4111 1111 1111 1111', '123-45-6789'),
      (pre, post, value) => {
        const text = 'a'.repeat(pre) + ' ' + value + ' ' + 'b'.repeat(post);
        return find(text).length === 1;
      },
    ),
  );
  t.pass('every generated placement found exactly once (fast-check throws on the first that is not)');
});

t.test('Luhn and SSN helpers', async (t) => {
  t.ok(luhnValid('79927398713'));
  t.notOk(luhnValid('79927398710'));
  t.ok(isCardNumber('4111111111111111'));
  t.notOk(isCardNumber('1111111111111117'), 'issuer digit 1 is not a card network');
  t.ok(isSsn('078-05-1120'));
  t.notOk(isSsn('078-05-112'));
});

// The byte walk of card and SSN runs (linear on a megabyte run) finds exactly what the string version
// it replaced found: that version, kept here as the reference, against random digit runs.
function referenceRun(run: string): string[] {
  const out: [string, string][] = [];
  for (const part of run.split(' '))
    if (part.length === 11 && isSsn(part)) out.push(['US social security number', part]);
  const groups = [...run.matchAll(/\d+/g)].map((m) => ({ at: m.index, end: m.index + m[0].length, digits: m[0] }));
  for (let i = 0; i < groups.length; i++) {
    let digits = '';
    for (let j = i; j < groups.length; j++) {
      if (j > i && (groups[j - 1].digits.length < 4 || groups[j - 1].digits.length > 6)) break;
      digits += groups[j].digits;
      if (digits.length > 19) break;
      if (digits.length >= 13 && isCardNumber(digits)) {
        out.push(['credit card number', run.slice(groups[i].at, groups[j].end)]);
        i = j;
        break;
      }
    }
  }
  // The scan reports each distinct value once, in the order found.
  const seen = new Set<string>();
  return out.filter(([, v]) => !seen.has(v) && seen.add(v)).map(([d, v]) => `${d}|${v.slice(0, 4)}****`);
}

t.test('card and SSN runs: the byte walk matches the string reference', async (t) => {
  const group = fc.oneof(
    fc.stringMatching(/^[0-9]{1,7}$/),
    fc.constantFrom('4111', '1111', '4242', '5555', '4444', '123', '45', '6789', '4111111111111111'),
  );
  const run = fc
    .array(fc.tuple(group, fc.constantFrom(' ', '-')), { minLength: 1, maxLength: 12 })
    .map((gs) => gs.map(([g, sep], i) => (i === 0 ? g : sep + g)).join(''));
  fc.assert(
    fc.property(
      run,
      (r) => JSON.stringify(matches(`x ${r} x`)) === JSON.stringify(r.length >= 11 ? referenceRun(r) : []),
    ),
    { numRuns: 3000 },
  );
  t.pass('3000 random runs agree (fast-check throws on the first that does not)');
});
