import t from 'tap';
import { namedModels } from '../../../pipeline/inspectors/named-models.ts';

const b = (s: string | Buffer) => (typeof s === 'string' ? Buffer.from(s) : s);
const sorted = (x: (string | null)[] | null) => (x === null ? null : [...x].sort());

t.test('a JSON body: every model key at any depth, escapes decoded, text in strings ignored', async (t) => {
  t.same(namedModels(b('{"model":"m1","input":"say \\"model\\": \\"m9\\""}')), ['m1'], 'a quoted key inside a string value is text');
  t.same(sorted(namedModels(b('{"requests":[{"params":{"model":"a"}},{"params":{"model":"b"}}]}'))), ['a', 'b']);
  t.same(namedModels(b('{"mod\\u0065l":"x"}')), ['x']);
  t.same(namedModels(b('{"Model":"x"}')), ['x'], 'any case: Go decoders match field names without case');
  t.same(namedModels(b('{"model":7}')), [null], 'a model that is not a string is named as null');
  t.same(namedModels(b('{"model":"a","model":"b"}')), ['b'], 'the last duplicate, as the provider reads it');
  t.same(namedModels(b('{"input":"hi"}')), [], 'naming no model');
  t.same(namedModels(b('')), []);
  t.same(namedModels(b('\ufeff{\n  "model": "x"\n}')), ['x'], 'a byte order mark before pretty-printed JSON');
});

t.test('a body that may name a model in a form we cannot read is null', async (t) => {
  t.equal(namedModels(b('{"model":"gpt-4o","input":"x","dimensions":NaN}')), null, 'JSON that Python reads and JavaScript does not');
  t.equal(namedModels(b('{"custom_id":"a","body":{"mo')), null, 'one JSON document cut short');
  t.equal(namedModels(b('{"a":1}\n{"body":{"model":"x"')), null, 'a JSONL line cut in two');
  t.equal(namedModels(b('"x"}}\n1,"model":"gpt-4o"}}\n')), null, 'the second half of a cut line, when it shows the key');
  const wide = `[${Array.from({ length: 5_000_001 }, () => '[]').join(',')}]`;
  t.equal(namedModels(b(wide)), null, 'past the node budget');
});

t.test('JSONL and plain text are read line by line, with any line ending', async (t) => {
  t.same(sorted(namedModels(b('{"body":{"model":"a"}}\n{"body":{"model":"b"}}\n'))), ['a', 'b']);
  t.same(sorted(namedModels(b('{"body":{"model":"a"}}\r{"body":{"model":"b"}}'))), ['a', 'b'], 'a bare CR between lines');
  t.same(namedModels(b('notes\nthe model: is fine in prose\nconst x = {\n')), [], 'prose and code name nothing');
  t.same(namedModels(Buffer.from([0x25, 0x50, 0x44, 0x46, 0xff, 0xfe, 0x00, 0x22, 0x6d, 0x6f, 0x64, 0x65, 0x6c, 0x22, 0x3a])), [], 'binary content names nothing');
});

t.test('multipart: a model field names its value; every other part is read as a body', async (t) => {
  const form = (parts: string[]) => `${parts.map((p) => `--XyZ\r\n${p}\r\n`).join('')}--XyZ--\r\n`;
  const type = 'multipart/form-data; boundary=XyZ';
  const audio = form(['Content-Disposition: form-data; name="model"\r\n\r\ngpt-4o-transcribe', 'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\nRIFF\u0000\u0001']);
  t.same(namedModels(b(audio), type), ['gpt-4o-transcribe']);
  const batch = form(['Content-Disposition: form-data; name="purpose"\r\n\r\nbatch', 'Content-Disposition: form-data; name="file"; filename="b.jsonl"\r\n\r\n{"body":{"model":"c"}}\n{"body":{"model":"d"}}\n']);
  t.same(sorted(namedModels(b(batch), type)), ['c', 'd']);
  t.same(sorted(namedModels(b(batch), 'multipart/form-data; boundary="XyZ"')), ['c', 'd'], 'a quoted boundary');
  t.equal(namedModels(b('--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nx'), type), null, 'a part never closed');
});

t.test('nesting past 64 levels is not read', async (t) => {
  const deep = '{"a":'.repeat(70) + '{"model":"hidden"}' + '}'.repeat(70);
  t.same(namedModels(b(deep)), []);
  const shallow = '{"a":'.repeat(10) + '{"model":"seen"}' + '}'.repeat(10);
  t.same(namedModels(b(shallow)), ['seen']);
});
