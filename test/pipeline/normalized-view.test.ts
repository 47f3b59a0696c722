import t from 'tap';
import fc from 'fast-check';
import { caseFold, foldedText, mayNormalize, normalizedView, normalizeText } from '../../pipeline/normalized-view.ts';

const view = (s: string | Buffer) => normalizedView(Buffer.isBuffer(s) ? s : Buffer.from(s));
const text = (s: string | Buffer) => view(s)?.bytes.toString('utf8') ?? null;

t.test('nothing to build: ASCII without an entity, and text NFKC leaves alone', async (t) => {
  t.notOk(mayNormalize(Buffer.from('{"model":"m","messages":[]}')), 'the prefilter turns plain ASCII away');
  t.ok(mayNormalize(Buffer.from('a & b')));
  t.ok(mayNormalize(Buffer.from('café')));
  t.equal(text('plain ascii, no entity'), null);
  t.equal(text('R&D, Tom & Jerry, a && b, &unknown; &#; &#x; &commat'), null, 'an & that starts no entity');
  t.equal(text('日本語のテキスト, Ελληνικά, русский, café, 🔑'), null, 'already normal');
  t.equal(text(Buffer.from([0x61, 0xff, 0xfe, 0x62])), null, 'invalid UTF-8 alone is kept as sent');
});

t.test('what is normalized', async (t) => {
  const cases: [string, string][] = [
    ['AKIA\u200bIOSF', 'AKIAIOSF'],
    ['a\u200cb\u200dc\u2060d\ufeffe\u00adf', 'abcdef'],
    ['a\ufe0fb\u{e0041}c\u034fd\u180ee\u3164f\u115fg\u200eh\u202ei', 'abcdefghi'],
    ['bob＠example．com', 'bob@example.com'],
    ['４１１１－１１１１', '4111-1111'],
    ['𝐀𝐊𝐈𝐀 ﬁle …', 'AKIA file ...'],
    ['A\u0336K\u0336', 'AK'],
    ['e\u0301', 'é'],
    ['a\u00a0b\u3000c', 'a b c'],
    ['sk\u2010ant\u2212x', 'sk-ant-x'],
    ['&#64; &#x40; &#X40; &#64 &#0064; &commat; &period; &lowbar; &hyphen; &colon; &sol; &num; &excl; &lt;&gt;&quot;&apos;', '@ @ @ @ @ @ . _ - : / # ! <>"\''],
    ['&Aopf;&kfr;&Zscr;', 'AkZ'],
    ['x&ampy &lt3', 'x&y <3'],
    ['&nbsp;&shy;&ZeroWidthSpace;&zwj;', ' '],
    ['&#0; &#x110000; &#xD800; &#150; &#128;', '\ufffd \ufffd \ufffd - \u20ac'],
    ['&amp;#64;', '@'],
    ['&amp;amp;#64;', '@'],
    ['&amp;amp;amp;#64;', '&#64;'],
    ['＆#64;', '@'],
    ['&#x200b;', ''],
    ['&#xff21;', 'A'],
    ['👨\u200d👩\u200d👧', '👨👩👧'],
  ];
  for (const [input, expected] of cases) t.equal(text(input), expected, JSON.stringify(input));
  t.equal(normalizeText('ＨＵＮＴＥＲ\u200b2'), 'HUNTER2');
  t.equal(normalizeText('already'), 'already');
});

t.test('a character whose compatibility form more than doubles it is kept as it is', async (t) => {
  t.equal(text('x\ufdfa'), null, 'U+FDFA (18 characters in NFKC)');
  t.equal(text('\ufdfa\uff21'), '\ufdfaA', 'its neighbours are still normalized');
  t.equal(text('&#xFDFA;'), '\ufdfa');
});

t.test('spans map back to the original bytes', async (t) => {
  const input = 'bob&#64;example.com';
  const v = view(input)!;
  t.equal(v.bytes.toString(), 'bob@example.com');
  t.same(v.span(0, 3), { start: 0, end: 3 }, 'kept bytes map one to one');
  t.same(v.span(3, 4), { start: 3, end: 8 }, 'the @ is the whole entity');
  t.same(v.span(4, 11), { start: 8, end: 15 });
  t.same(v.span(0, v.bytes.length), { start: 0, end: input.length });
  t.equal(input.slice(v.span(2, 5).start, v.span(2, 5).end), 'b&#64;e');

  const z = view('AKIA\u200bIOSF')!;
  t.same(z.span(4, 8), { start: 7, end: 11 }, 'after a dropped ZWSP (3 bytes)');
  t.same(z.span(0, 8), { start: 0, end: 11 });

  const fw = view('key ＡＫＩＡ!')!;
  t.equal(fw.bytes.toString(), 'key AKIA!');
  t.same(fw.span(4, 8), { start: 4, end: 16 }, 'four full-width letters, 12 bytes');
  t.same(fw.span(8, 9), { start: 16, end: 17 });

  const twice = view('x&amp;#64;y')!;
  t.equal(twice.bytes.toString(), 'x@y');
  t.same(twice.span(1, 2), { start: 1, end: 10 }, 'two levels compose');
  t.same(twice.span(2, 3), { start: 10, end: 11 });
  t.same(twice.span(5, 1), { start: 11, end: 11 }, 'out-of-range spans are clamped');
});

t.test('worst cases stay bounded in size (their speed is measured in bench/pipeline.ts)', async (t) => {
  const marks = Buffer.from('a' + '\u0301\u0316'.repeat(100_000));
  const m = view(marks)!;
  t.ok(m.bytes.length <= marks.length, 'a flood of combining marks');
  t.ok(m.bytes.toString().startsWith('á'));
  t.ok(m.bytes.length < 100, 'marks past 32 in a row are dropped');
  const thai = 'ก\u0e34\u0e48'.repeat(1000);
  t.equal(text(thai + '\u0301'.repeat(40) + 'x'), thai + '\u0301'.repeat(30) + 'x', 'Thai keeps its marks; of a run, 32 in a row are kept');
  const digits = Buffer.from('&#' + '0'.repeat(500_000) + '64;');
  t.equal(text(digits), '@', 'a long run of leading zeros');
  t.equal(text('&'.repeat(300_000) + '#64;'), '&'.repeat(299_999) + '@', 'an & flood');
  t.equal(text('&#'.repeat(100_000)), null);
  const expand = Buffer.from('\ufdfa\u3300'.repeat(50_000));
  t.ok((view(expand)?.bytes.length ?? 0) <= 3 * expand.length);
});

t.test('case folding', async (t) => {
  t.equal(caseFold('HUNTER2-Ω-ΣΑΣ'), 'hunter2-ω-σασ', 'final sigma reads as σ');
  t.equal(foldedText(Buffer.from('ABC-def')), 'abc-def');
  t.equal(foldedText(Buffer.from('ÄÖÜ-X')), 'äöü-x');
});

// Strings made of the characters the view changes, among plain ones.
const piece = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 6 }),
  fc.constantFrom('&', '&#', '&#x', ';', '&amp;', '&#64;', '&#x200b;', '&commat;', '&lt', '&Aopf;', '\u200b', '\u00ad', '\ufe0f', '\u{e0041}',
    '＠', 'Ａ', '４', '\u0301', '\u0316', 'e', 'A', '\ufdfa', '\u3164', '\u2010', '\ud800', '\udfff', '👨\u200d👩'),
);

t.test('property: never throws; spans lie inside the original, in order; the view is at most three times the input', async (t) => {
  fc.assert(fc.property(fc.array(piece, { maxLength: 40 }), fc.array(fc.nat(), { maxLength: 6 }), (pieces, cuts) => {
    const input = Buffer.from(pieces.join(''));
    const v = normalizedView(input);
    if (v === null) return true;
    const n = v.bytes.length;
    const whole = v.span(0, n);
    if (whole.start < 0 || whole.end > input.length) return false;
    const points = [0, n, ...cuts.map((c) => c % (n + 1))].sort((a, b) => a - b);
    let last = { start: 0, end: 0 };
    for (let k = 1; k < points.length; k++) {
      const s = v.span(points[k - 1], points[k]);
      if (s.start < 0 || s.end > input.length || s.start > s.end) return false;
      if (s.start < last.start) return false;
      last = s;
    }
    return v.bytes.length <= 3 * input.length + 64;
  }), { numRuns: 2000 });
});

t.test('property: the span of a word that came through holds that word in the original', async (t) => {
  // Plain ASCII words between entities and invisibles: each is found inside the input span its view
  // bytes map to (exactly that span when the word borders the changed text; inside a chunk NFKC
  // changed in several places, within the chunk's span).
  const word = fc.stringMatching(/^[a-z0-9]{1,8}$/);
  const noise = fc.constantFrom('&#x200b;', '\u200b', '&amp;', '＠', '\u00ad', '&lt;', ' ');
  fc.assert(fc.property(fc.array(fc.tuple(word, noise), { minLength: 1, maxLength: 20 }), (parts) => {
    const input = Buffer.from(parts.map(([w, z]) => w + z).join(''));
    const v = normalizedView(input);
    if (v === null) return parts.every(([, z]) => z === ' ');
    const out = v.bytes.toString('latin1');
    let from = 0;
    for (const [w] of parts) {
      const at = out.indexOf(w, from);
      if (at < 0) return false;
      const s = v.span(at, at + w.length);
      if (!input.toString('latin1', s.start, s.end).includes(w)) return false;
      from = at + w.length;
    }
    return true;
  }));
});
