import t from 'tap';
import { namedModels } from '../../pipeline/named-models.ts';

const b = (s: string | Buffer) => (typeof s === 'string' ? Buffer.from(s) : s);
const sorted = (x: string[] | null) => (x === null ? null : [...x].sort());
const FORM = 'multipart/form-data; boundary=XyZ';
const form = (parts: string[], eol = '\r\n') => `${parts.map((p) => `--XyZ${eol}${p}${eol}`).join('')}--XyZ--${eol}`;
const file = (name: string, content: string) =>
  `Content-Disposition: form-data; name="file"; filename="${name}"\r\n\r\n${content}`;

t.test(
  'a JSON body: every string model at any depth and in any case; escapes decoded; text in strings ignored',
  async (t) => {
    t.same(
      namedModels(b('{"model":"m1","input":"say \\"model\\": \\"m9\\""}')),
      ['m1'],
      'a quoted key inside a string value is text',
    );
    t.same(sorted(namedModels(b('{"requests":[{"params":{"model":"a"}},{"params":{"model":"b"}}]}'))), ['a', 'b']);
    t.same(namedModels(b('{"mod\\u0065l":"x"}')), ['x']);
    t.same(namedModels(b('{"Model":"x"}')), ['x'], 'any case: Go decoders match field names without case');
    t.same(
      namedModels(b('{"model":7,"tools":[{"input_schema":{"properties":{"model":{"type":"string"}}}}]}')),
      [],
      'a number or a schema object names no model',
    );
    t.same(namedModels(b('{"model":"a","model":"b"}')), ['b'], 'the last duplicate, as the provider reads it');
    t.same(namedModels(b('{"input":"hi"}')), []);
    t.same(namedModels(b('')), []);
    t.same(namedModels(b('\ufeff{\n  "model": "x"\n}')), ['x'], 'a byte order mark before pretty-printed JSON');
    t.same(namedModels(b('{"model":"x","input":"caf\xff"}')), ['x'], 'a byte that is not UTF-8 does not hide the JSON');
    t.same(namedModels(b('plain text that mentions a model')), [], 'not JSON: names nothing');
  },
);

t.test('JSON another parser may read and we cannot is null', async (t) => {
  t.equal(namedModels(b('{"model":"gpt-4o","input":"x","dimensions":NaN}')), null, 'NaN, valid to Python');
  t.equal(
    namedModels(b('{"model"\n:"text-embedding-3-large",\n"dimensions":NaN}')),
    null,
    'the key and its colon on two lines',
  );
  t.equal(namedModels(b('{"mod\\u0065l":"x","d":NaN}')), null, 'an escape that can spell the key');
  t.same(namedModels(b('{"input":"x","d":NaN}')), [], 'nothing in it can name a model');
  t.equal(
    namedModels(b(`{"model":"x","a":[${Array.from({ length: 5_000_001 }, () => '[]').join(',')}]}`)),
    null,
    'past the node budget',
  );
});

t.test('multipart: a model field names its value; a batch file is read line by line', async (t) => {
  const audio = form([
    'Content-Disposition: form-data; name="model"\r\n\r\ngpt-4o-transcribe',
    file('a.wav', 'RIFF\u0000\u0001'),
  ]);
  t.same(namedModels(b(audio), FORM), ['gpt-4o-transcribe']);
  t.same(
    namedModels(b(form(['Content-Disposition: form-data; name=model\r\n\r\nx'])), FORM),
    ['x'],
    'an unquoted name',
  );
  t.same(
    namedModels(b(form(['Content-Disposition: form-data; name="model"\n\nx'], '\n')), FORM),
    ['x'],
    'LF line endings',
  );
  const lines =
    '{"custom_id":"1","body":{"model":"c"}}\n{"custom_id":"2","body":{"model":"d"}}\r{"custom_id":"3","params":{"model":"e"}}\n';
  t.same(
    sorted(
      namedModels(
        b(form(['Content-Disposition: form-data; name="purpose"\r\n\r\nbatch', file('b.jsonl', lines)])),
        FORM,
      ),
    ),
    ['c', 'd', 'e'],
    'any line ending',
  );
  t.same(
    sorted(namedModels(b(form([file('b.jsonl', lines)])), 'multipart/form-data; boundary="XyZ"')),
    ['c', 'd', 'e'],
    'a quoted boundary',
  );
  t.same(
    namedModels(b(form([file('cars.json', '[{"make":"Ford","model":"Focus"}]')])), FORM),
    [],
    'a data file is no batch file',
  );
  t.same(
    namedModels(b(form([file('cfg.py', 'CFG = {\n    "model": "gpt-4o",\n}\n')])), FORM),
    [],
    'nor is source code',
  );
  t.same(
    namedModels(b(form([file('a.wav', 'RIFF x --XyZ-- y model')])), FORM),
    [],
    'a delimiter counts only at the start of a line',
  );
});

t.test('multipart that parsers may read differently is null', async (t) => {
  t.equal(
    namedModels(
      b(form(['Content-Disposition: form-data; name="model"\r\n\r\nx'])),
      'multipart/form-data; x="; boundary=AAA"; boundary=XyZ',
    ),
    null,
    'two boundaries',
  );
  t.equal(
    namedModels(b('--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nx'), FORM),
    null,
    'a part never closed',
  );
  t.equal(
    namedModels(b(form(['Content-Disposition: form-data; name="data"\r\n\r\n{"custom_id":"1","body":{"mo'])), FORM),
    null,
    'a chunk of an upload cut inside a request line',
  );
  t.equal(
    namedModels(b(form([file('b.jsonl', '"x"}}\n{"custom_id":"2","body":{"model":"gpt-4o"')])), FORM),
    null,
    'a .jsonl file with a cut line',
  );
  const junk = `Content-Disposition: form-data; ${'content-disposition:'.repeat(2000)} name="model"\r\n\r\nx`;
  t.equal(namedModels(b(form([junk])), FORM), null, 'part headers past 16 KiB');
});

t.test('nesting past 64 levels is not read', async (t) => {
  const deep = '{"a":'.repeat(70) + '{"model":"hidden"}' + '}'.repeat(70);
  t.same(namedModels(b(deep)), []);
  const shallow = '{"a":'.repeat(10) + '{"model":"seen"}' + '}'.repeat(10);
  t.same(namedModels(b(shallow)), ['seen']);
});
