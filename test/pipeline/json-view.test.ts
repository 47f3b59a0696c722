import t from 'tap';
import fc from 'fast-check';
import {
  carriesJsonEscapes,
  decodedViews,
  deepScanView,
  hidesCharacters,
  scanView,
  topLevel,
  topLevelOf,
  topLevelString,
} from '../../pipeline/json-view.ts';
import { llmRequestBody } from '../../bench/corpus.ts';
import { referenceDeepScanView, referenceHidesCharacters, referenceScanView } from './json-view.reference.ts';

t.test('the view decodes every JSON escape', async (t) => {
  const original = 'a@b "q" \\ / \n\t\r\b\f é 😀 \u0000';
  const json = JSON.stringify({ s: original }).replace('@', '\\u0040').replace('/', '\\/');
  t.equal(scanView(Buffer.from(json)).toString(), `{"s":"${original}"}`);
});

t.test('which bodies carry JSON escapes: JSON and SSE, after white space or a byte order mark', async (t) => {
  for (const body of ['{"a":"\\u0041"}', '  \n[1]', '"s"', 'data: {}', '\ufeff{"a":1}', '\ufeff \r\n{"a":1}'])
    t.ok(carriesJsonEscapes(Buffer.from(body)), JSON.stringify(body));
  for (const body of ['plain \\u0041 text', 'a=1&b=\\u0041', '', '\ufeff', '\ufeffplain', '\ufeff\ufeff{}'])
    t.notOk(carriesJsonEscapes(Buffer.from(body)), JSON.stringify(body));
  t.equal(scanView(Buffer.from('\ufeff{"k":"AKIA\\u0049OSF"}')).toString(), '\ufeff{"k":"AKIAIOSF"}');
});

t.test('bodies without backslashes are returned as is (no copy)', async (t) => {
  const b = Buffer.from('{"a":"b"}');
  t.equal(scanView(b), b);
});

t.test('non-JSON bodies keep their backslashes', async (t) => {
  const b = Buffer.from('C:\\new\\users and \\u0040');
  t.equal(scanView(b), b);
  t.ok(carriesJsonEscapes(Buffer.from('data: {"a":"\\n"}\n\n')), 'SSE of JSON events');
  t.ok(carriesJsonEscapes(Buffer.from('  [1]')));
  t.notOk(carriesJsonEscapes(Buffer.from('hello')));
});

t.test('invalid escapes and lone surrogates do not break the view', async (t) => {
  t.equal(scanView(Buffer.from('{"a":"\\x \\u12 \\uD800 end\\')).toString(), '{"a":"\\x \\u12 \uFFFD end\\');
});

t.test('property: the view of JSON.stringify(s) holds s', async (_t) => {
  fc.assert(
    fc.property(fc.string({ unit: 'binary' }), (s) => {
      const view = scanView(Buffer.from(JSON.stringify({ k: s }))).toString();
      return (
        view ===
        `{"k":"${s.replace(/[\uD800-\uDFFF]/g, (c, i, str) => {
          const code = c.charCodeAt(0);
          const pairedHigh = code <= 0xdbff && /[\uDC00-\uDFFF]/.test(str[i + 1] ?? '');
          const pairedLow = code >= 0xdc00 && /[\uD800-\uDBFF]/.test(str[i - 1] ?? '');
          return pairedHigh || pairedLow ? c : '\uFFFD';
        })}"}`
      );
    }),
  );
});

t.test('topLevelString', async (t) => {
  t.equal(topLevelString(Buffer.from('{"model":"a"}'), 'model'), 'a');
  t.equal(topLevelString(Buffer.from('{"x":{"model":"n"},"y":["model"],"model" : "b\\"c"}'), 'model'), 'b"c');
  t.equal(topLevelString(Buffer.from('{"x":1}'), 'model'), null);
  t.equal(topLevelString(Buffer.from('[{"model":"a"}]'), 'model'), null);
  t.equal(topLevelString(Buffer.from('{"model":1}'), 'model'), null);
  t.equal(topLevelString(Buffer.from('{"model":"a","model":"b"}'), 'model'), 'b');
  t.equal(topLevelString(Buffer.from('{"mod\\u0065l":"a"}'), 'model'), 'a', 'an escaped key is the same key');
  t.equal(topLevelString(Buffer.from('{"a":"\\\\","model":"q"}'), 'model'), 'q', 'escaped backslash before a quote');
  t.equal(
    topLevelString(Buffer.from('{"models":"a","mode":"b","Model":"c"}'), 'model'),
    null,
    'a longer, shorter or other-case key is another key',
  );
  t.equal(
    topLevelString(Buffer.from('{"mod\\u0065ls":"a","mo\\"del":"b"}'), 'model'),
    null,
    'escaped keys that decode to something else',
  );
  t.equal(
    topLevelString(Buffer.from('{"modèle":"x","model":"y"}'), 'modèle'),
    'x',
    'a non-ASCII key is compared by its UTF-8 bytes',
  );
  t.equal(
    topLevelString(Buffer.from('{"mod\\ud800l":"a"}'), 'model'),
    null,
    'a lone surrogate escape is read, and differs',
  );
});

// topLevelOf reads several keys in one walk (the prefix step reads the prompt, the model and the
// thread): each value must be the one JSON.parse reads, and the one topLevel finds for that key alone.
t.test('topLevelOf: each key as JSON.parse and topLevel read it, in one walk', async (t) => {
  const keys = ['model', 'system', 'thread', 'mod"el', 'Model'];
  const key = fc.constantFrom(...keys, 'other', 'messages');
  const member = fc.tuple(key, fc.jsonValue({ maxDepth: 2 }), fc.boolean());
  fc.assert(
    fc.property(fc.array(member, { maxLength: 8 }), fc.subarray(keys, { minLength: 1 }), (members, wanted) => {
      // Some keys escaped (`\u006d` for `m`): the same key to JSON.parse.
      const text = `{${members.map(([k, v, esc]) => `${esc ? JSON.stringify(k).replace(/m/g, '\\u006d') : JSON.stringify(k)} : ${JSON.stringify(v)}`).join(' , ')}}`;
      const body = Buffer.from(text);
      const parsed = JSON.parse(text) as Record<string, unknown>;
      const found = topLevelOf(body, wanted);
      if (found === null) return false;
      return wanted.every((k, i) => {
        const one = topLevel(body, k);
        const span = found.values[i];
        if (one === null || one.open !== found.open || one.close !== found.close || one.empty !== found.empty)
          return false;
        if (JSON.stringify(one.value) !== JSON.stringify(span)) return false;
        if (!Object.hasOwn(parsed, k)) return span === null;
        return (
          span !== null && JSON.stringify(JSON.parse(text.slice(span.start, span.end))) === JSON.stringify(parsed[k])
        );
      });
    }),
    { numRuns: 500 },
  );
  t.same(topLevelOf(Buffer.from('{"model":"a","system":"s","model":"b"}'), ['system', 'model'])?.values, [
    { start: 22, end: 25 },
    { start: 34, end: 37 },
  ]);
  t.equal(topLevelOf(Buffer.from('["model"]'), ['model', 'system']), null, 'not an object');
  t.same(topLevelOf(Buffer.from(' { } '), ['model', 'system']), {
    open: 1,
    close: 3,
    empty: true,
    values: [null, null],
  });
});

// The decoded view is built in place since P13 (json-view.ts, decodeLevel), and the literal view is
// told by the same walk: both must be byte for byte what the copy-every-byte view and the three
// indexOf passes gave (json-view.reference.ts), on bodies dense with every kind of escape.

/** Bodies made of the pieces escapes are made of, JSON (or SSE) or not, nested levels included. */
const escapeHeavy = fc
  .tuple(
    fc.constantFrom('{"a":"', '[', '"', 'data: {"d":"', '  {"x":"', 'plain text ', ''),
    fc.array(
      fc.oneof(
        fc.constantFrom(
          '\\\\',
          '\\n',
          '\\"',
          '\\/',
          '\\t',
          '\\r',
          '\\b',
          '\\f',
          '\\u0040',
          '\\u00e9',
          '\\uD83D\\uDE00',
          '\\uD800',
          '\\uDC00x',
          '\\u12',
          '\\u',
          '\\x',
          '\\\\u0041',
          '\\\\\\\\n',
          '\\\\\\u0040',
          'AKIA',
          '@',
          ' ',
          'é',
        ),
        fc.string({ maxLength: 40 }),
        fc.string({ minLength: 20, maxLength: 120, unit: fc.constantFrom('a', 'b', ' ', '1', '-') }),
      ),
      { maxLength: 60 },
    ),
    fc.constantFrom('"}', '', '\\\\', '\\', '\\u00'),
  )
  .map(([head, parts, tail]) => Buffer.from(head + parts.join('') + tail));

t.test('property: the in-place decoded view is the copied one, at every level', async (_t) => {
  fc.assert(
    fc.property(escapeHeavy, (body) => {
      const views = decodedViews(body);
      const reference = referenceDeepScanView(body);
      if (!views.decoded.equals(reference)) return false;
      if (!deepScanView(body).equals(reference) || !scanView(body).equals(referenceScanView(body))) return false;
      // The literal view as InspectionInput chose it before: the body, or decoded when escapes hide.
      const literal = referenceHidesCharacters(body) ? reference : body;
      return views.literal.equals(literal);
    }),
    { numRuns: 3000 },
  );
});

t.test('property: the same on arbitrary strings, escaped once or twice', async (_t) => {
  fc.assert(
    fc.property(fc.string({ unit: 'binary' }), fc.boolean(), (s, twice) => {
      const once = JSON.stringify({ k: s });
      const body = Buffer.from(twice ? JSON.stringify({ args: once }) : once);
      const views = decodedViews(body);
      const reference = referenceDeepScanView(body);
      return views.decoded.equals(reference) && views.literal.equals(referenceHidesCharacters(body) ? reference : body);
    }),
    { numRuns: 2000 },
  );
});

t.test('the benchmark corpus decodes as before, and a body with nothing decoded is not copied', async (t) => {
  for (const size of [4 * 1024, 256 * 1024]) {
    const body = llmRequestBody(size, 3);
    const views = decodedViews(body);
    t.ok(views.decoded.equals(referenceDeepScanView(body)), `decoded view of ${size} bytes`);
    t.equal(views.literal, body, 'no escape hides a character: the literal view is the body itself');
  }
  const plain = Buffer.from('{"a":"no escapes here"}');
  t.equal(decodedViews(plain).decoded, plain);
  const invalid = Buffer.from('{"a":"\\u12 and \\x"}');
  t.equal(decodedViews(invalid).decoded, invalid, 'only escapes that decode to nothing: the body itself');
  t.equal(decodedViews(invalid).literal, invalid);
});

t.test('property: one RE2 search tells hiding escapes as the three indexOf passes did, on any bytes', async (_t) => {
  // Invalid UTF-8 (lone continuation bytes, truncated sequences) around the pairs included.
  const byte = fc.oneof(
    fc.constantFrom(0x5c, 0x5c, 0x75, 0x2f, 0x6e, 0x22),
    fc.constantFrom(0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff, 0x00),
    fc.integer({ min: 0, max: 255 }),
  );
  fc.assert(
    fc.property(fc.array(byte, { maxLength: 80 }), (bytes) => {
      const body = Buffer.from(bytes);
      return hidesCharacters(body) === referenceHidesCharacters(body);
    }),
    { numRuns: 5000 },
  );
});
