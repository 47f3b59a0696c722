import t from 'tap';
import fc from 'fast-check';
import { carriesJsonEscapes, scanView, topLevelString } from '../../pipeline/json-view.ts';

t.test('the view decodes every JSON escape', async (t) => {
  const original = 'a@b "q" \\ / \n\t\r\b\f é 😀 \u0000';
  const json = JSON.stringify({ s: original }).replace('@', '\\u0040').replace('/', '\\/');
  t.equal(scanView(Buffer.from(json)).toString(), `{"s":"${original}"}`);
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
