import fc from 'fast-check';
import t from 'tap';
import { SseParser } from '../../../../core/sse.ts';
import { type SseFrame, SseFramer } from '../../../../proxy/llm/tools/sse-frames.ts';

// The framer the tool gate reads streams with: whole events with their exact bytes, however the bytes
// are cut, and the same fields as the WHATWG parser (core/sse.ts).

const frame = (chunks: Buffer[]): SseFrame[] => {
  const f = new SseFramer();
  return [...chunks.flatMap((c) => f.push(c)), ...f.end()];
};

const STREAM = Buffer.from(
  ': a comment\n' +
    'event: one\ndata: {"a":1}\n\n' +
    'data: first line\r\ndata: second line\r\n\r\n' +
    'event: cr\rdata: é ü 漢字\r\r' +
    'id: 7\nretry: 100\nunknown: x\ndata\n\n' +
    '\n' +
    'data:no space\n\n' +
    'data: last without blank line',
);

t.test('events, their bytes and fields, LF, CRLF and CR alike', async (t) => {
  const frames = frame([STREAM]);
  t.equal(Buffer.concat(frames.map((f) => f.raw)).toString(), STREAM.toString(), 'every byte, in order');
  t.same(
    frames.map((f) => [f.event, f.data]),
    [
      ['one', '{"a":1}'],
      [null, 'first line\nsecond line'],
      ['cr', 'é ü 漢字'],
      [null, ''],
      [null, null],
      [null, 'no space'],
      [null, 'last without blank line'],
    ],
  );
  t.equal(frames[0].raw.toString(), ': a comment\nevent: one\ndata: {"a":1}\n\n', 'a comment rides with its event');
});

t.test('cut at every byte, and at every pair of bytes, the frames are the same', async (t) => {
  const whole = frame([STREAM]);
  for (let i = 0; i <= STREAM.length; i++) {
    const cut = frame([STREAM.subarray(0, i), STREAM.subarray(i)]);
    if (JSON.stringify(cut) !== JSON.stringify(whole)) t.fail(`cut at ${i}`);
  }
  const bytes = [...STREAM].map((b) => Buffer.from([b]));
  t.same(frame(bytes), whole, 'one byte at a time (UTF-8 sequences split too)');
});

t.test('property: any cuts of any stream give the bytes back and the WHATWG parser’s events', async (t) => {
  const line = fc.oneof(
    fc.constantFrom('', ': c', 'event: x', 'data', 'data:', 'data: {"k":"v"}', 'id: 1', 'retry: 5', 'data: ü€'),
    fc.string({ maxLength: 6 }).map((s) => `data: ${s.replace(/[\r\n]/g, '')}`),
  );
  const eol = fc.constantFrom('\n', '\r\n', '\r');
  await fc.assert(
    fc.property(
      fc.array(fc.tuple(line, eol), { maxLength: 30 }),
      fc.array(fc.nat(), { maxLength: 8 }),
      (lines, cuts) => {
        const text = Buffer.from(lines.map(([l, e]) => l + e).join(''));
        const at = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const chunks: Buffer[] = [];
        let from = 0;
        for (const c of at) {
          chunks.push(text.subarray(from, c));
          from = c;
        }
        chunks.push(text.subarray(from));
        const frames = frame(chunks);
        if (!Buffer.concat(frames.map((f) => f.raw)).equals(text)) return false;
        if (JSON.stringify(frames) !== JSON.stringify(frame([text]))) return false;
        const p = new SseParser();
        const theirs = [...p.push(text), ...p.end()].filter((e) => e.data !== '').map((e) => [e.event, e.data]);
        const ours = frames.filter((f) => f.data !== null && f.data !== '').map((f) => [f.event, f.data]);
        return JSON.stringify(ours) === JSON.stringify(theirs);
      },
    ),
    { numRuns: 300 },
  );
  t.pass('bytes given back, frames and events the same under every cut');
});

t.test('a byte-order mark opening the stream is not part of the first field', async (t) => {
  const bytes = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('event: e\ndata: d\n\n')]);
  const [f] = frame([bytes.subarray(0, 2), bytes.subarray(2)]);
  t.same([f.event, f.data], ['e', 'd']);
  t.ok(f.raw.equals(bytes), 'and it is kept in the bytes');
});

t.test('what is pending is counted, and a long line costs no more than its bytes', async (t) => {
  const f = new SseFramer();
  f.push(Buffer.from('data: '));
  for (let i = 0; i < 2000; i++) f.push(Buffer.alloc(1000, 0x61));
  t.equal(f.pending, 6 + 2_000_000);
  const [done] = f.push(Buffer.from('\n\n'));
  t.equal(done.data?.length, 2_000_000);
  t.equal(f.pending, 0);
});

t.test('a byte-order mark opening any line is dropped, as the SDKs do; a line of only one is blank', async (t) => {
  const f = new SseFramer();
  const bom = '\uFEFF';
  const frames = [...f.push(Buffer.from(`data: a\n${bom}\n${bom}data: b\n\n`)), ...f.end()];
  t.same(
    frames.map((x) => x.data),
    ['a', 'b'],
  );
  t.equal(Buffer.concat(frames.map((x) => x.raw)).toString(), `data: a\n${bom}\n${bom}data: b\n\n`, 'bytes kept');
});
