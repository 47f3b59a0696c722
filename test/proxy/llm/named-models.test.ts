import t from 'tap';
import { namedModels } from '../../../proxy/llm/named-models.ts';

const b = (s: string) => Buffer.from(s);

t.test('a JSON body: every model key at any depth, escapes decoded, text in strings ignored', async (t) => {
  t.same(namedModels(b('{"model":"m1","input":"say \\"model\\": \\"m9\\""}')), ['m1'], 'a quoted key inside a string value is text');
  t.same(namedModels(b('{"requests":[{"params":{"model":"a"}},{"params":{"model":"b"}}]}')).sort(), ['a', 'b']);
  t.same(namedModels(b('{"mod\\u0065l":"x"}')), ['x']);
  t.same(namedModels(b('{"model":7}')), [null], 'a model that is not a string is named as null');
  t.same(namedModels(b('{"model":"a","model":"b"}')), ['b'], 'the last duplicate, as the provider reads it');
  t.same(namedModels(b('{"input":"hi"}')), [], 'naming no model');
  t.same(namedModels(b('')), []);
});

t.test('JSONL and multipart bodies are read line by line', async (t) => {
  const jsonl = '{"body":{"model":"a"}}\n{"body":{"model":"b"}}\nnot json\n';
  t.same(namedModels(b(jsonl)).sort(), ['a', 'b']);
  const multipart = `--x\r\nContent-Disposition: form-data; name="file"; filename="b.jsonl"\r\n\r\n{"body":{"model":"c"}}\r\n--x--\r\n`;
  t.same(namedModels(b(multipart)), ['c']);
});

t.test('nesting past 64 levels is not read', async (t) => {
  const deep = '{"a":'.repeat(70) + '{"model":"hidden"}' + '}'.repeat(70);
  t.same(namedModels(b(deep)), []);
  const shallow = '{"a":'.repeat(10) + '{"model":"seen"}' + '}'.repeat(10);
  t.same(namedModels(b(shallow)), ['seen']);
});
