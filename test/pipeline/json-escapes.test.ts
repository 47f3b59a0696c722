import fc from 'fast-check';
import t from 'tap';
import { decodeEscapes, jsonEscapesDecoder } from '../../pipeline/json-escapes.ts';
import { decodedViews, decodeLevelScalar } from '../../pipeline/json-view.ts';

// The SIMD decoder (pipeline/json-escapes.ts) against the JS walk that defines a level of decoding
// (json-view.ts, decodeLevelScalar): the same bytes, the same `decoded` and `hides`, for every kind of
// escape, valid or not, wherever it falls in a chunk.

function same(body: Buffer): boolean {
  const from = body.indexOf(0x5c);
  if (from < 0) return true;
  const js = decodeLevelScalar(body, from);
  const simd = decodeEscapes(body, from)!;
  return js.decoded === simd.decoded && js.hides === simd.hides && (!js.decoded || js.bytes.equals(simd.bytes));
}

const UNITS = [
  'a',
  'lorem ipsum dolor sit amet ',
  '"',
  'é',
  '😀',
  '\\',
  '\\\\',
  '\\n',
  '\\"',
  '\\/',
  '\\b',
  '\\f',
  '\\r',
  '\\t',
  '\\x',
  '\\q',
  '\\u',
  '\\u0',
  '\\u00',
  '\\u004',
  '\\u0041',
  '\\u00e9',
  '\\u20AC',
  '\\uffff',
  '\\uGGGG',
  '\\u12G4',
  '\\uD83D',
  '\\uDE00',
  '\\uD83D\\uDE00',
  '\\udbff\\udfff',
  '\\uD83D\\u0041',
  '\\uD83D\\uD83D\\uDE00',
  '\\uD83D\\',
  '\\uD83D\\u',
  '\\uD83D\\uDE0',
];

t.test('this process decodes with WebAssembly SIMD', async (t) => {
  t.equal(jsonEscapesDecoder, 'simd', 'Node 24 has it; the JS walk is the fallback');
});

t.test('property: the same level as the JS walk, escapes of every kind', async () => {
  fc.assert(
    fc.property(fc.array(fc.constantFrom(...UNITS), { maxLength: 40 }), (units) => same(Buffer.from(units.join('')))),
    { numRuns: 20_000 },
  );
  // Any bytes at all, backslashes among them.
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 200 }), fc.array(fc.nat(199), { maxLength: 20 }), (bytes, at) => {
      const body = Buffer.from(bytes);
      for (const k of at) if (k < body.length) body[k] = 0x5c;
      return same(body);
    }),
    { numRuns: 20_000 },
  );
});

t.test('chunk seams: every escape at every offset around the 64 KB chunk end', async (t) => {
  // Chunks are counted from the first backslash: one opens the body, so the first seam is at 65,536.
  let checked = 0;
  for (let offset = 65536 - 20; offset <= 65536 + 4; offset++) {
    for (const unit of ['\\uD83D\\uDE00', '\\u0041', '\\n', '\\\\', '\\uD83D', '\\', '\\u00', '\\uD83D\\u0041']) {
      const body = Buffer.concat([
        Buffer.from('\\n'),
        Buffer.alloc(offset - 2, 'a'),
        Buffer.from(unit),
        Buffer.alloc(40, 'b'),
      ]);
      t.ok(same(body), `${JSON.stringify(unit)} at ${offset}`);
      t.ok(same(body.subarray(0, offset + unit.length)), `${JSON.stringify(unit)} at ${offset}, at the end`);
      checked += 2;
    }
  }
  // Escapes back to back over several chunks, and a body of backslashes.
  t.ok(same(Buffer.from('\\uD83D\\uDE00'.repeat(20_000))), 'surrogate pairs over four chunks');
  t.ok(same(Buffer.from('\\\\'.repeat(100_000))), 'escaped backslashes over three chunks');
  t.ok(same(Buffer.from('\\'.repeat(200_001))), 'lone backslashes');
  t.ok(checked > 0);
});

t.test('the views: a body decoded through the levels reads as with the JS walk', async (t) => {
  const body = Buffer.from(
    JSON.stringify({ messages: [{ role: 'user', content: JSON.stringify({ arg: 'AKIA\u0049OSF \\u0040 é "q"\n' }) }] }),
  );
  const views = decodedViews(body);
  t.match(views.decoded.toString(), 'AKIAIOSF @ é "q"', 'two levels down');
  t.equal(views.literal, views.decoded, 'an escape that hides: the literal view is the decoded one');
});
