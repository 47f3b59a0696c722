import { brotliCompressSync, gzipSync, zstdCompressSync } from 'node:zlib';
import t from 'tap';
import { request } from 'undici';
import { decodeBody } from '../../../proxy/egress/body-coding.ts';
import { AGENT_SECRET, startHarness } from './intercept-harness.ts';

// Content codings of an inspected request body. Each coding is undone (at most 32 MB of output per
// layer) before the body is inspected: a header listing a coding thousands of times (a gzip quine
// decodes to itself), or nested bombs each filling the bound, would make one request cost the
// gateway minutes of zlib work on the thread pool every DNS lookup also waits for. The codings a body
// may have are bounded, and decoding stops at the first layer whose output passes the bound.

t.setTimeout(60_000);

t.test('decoding stops at the first layer past the bound', async (t) => {
  // 64 MB of zeros, gzipped (~64 KB): past a 1 MB bound at once. Were the next layer (br) run on
  // that megabyte of zeros, it would fail to decode (broken).
  const bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024));
  const out = await decodeBody(bomb, ['br', 'gzip'], 1024 * 1024);
  t.equal(out.overflow, true);
  t.equal(out.broken, false, 'the layer under it was never decoded');
  t.equal(out.body.length, 1024 * 1024);
});

t.test('a body in more content codings than the gateway undoes is refused 415, nothing sent', async (t) => {
  const h = await startHarness();
  t.teardown(() => h.close());
  const dest = `https://dest.test:${h.upstream.port}`;
  let body: Buffer = Buffer.from('hello');
  const codings: string[] = [];
  for (let i = 0; i < 40; i++) {
    body = i % 2 === 0 ? gzipSync(body) : brotliCompressSync(body);
    codings.push(i % 2 === 0 ? 'gzip' : 'br');
  }
  const many = await request(`${dest}/many`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': codings.join(', ') },
    body,
  });
  t.equal(many.statusCode, 415);
  t.match(await many.body.json(), { error: { type: 'invalid_request_error', message: /content codings/ } });
  t.equal(h.upstream.seen.length, 0, 'nothing sent');

  const two = await request(`${dest}/two`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': 'gzip, br' },
    body: brotliCompressSync(gzipSync('two layers are fine')),
  });
  t.equal(two.statusCode, 200);
  await two.body.text();
  t.equal(h.upstream.seen.length, 1);
});

t.test('bytes the decoder leaves after its stream are not sent: another decoder would read them', async (t) => {
  const h = await startHarness();
  t.teardown(() => h.close());
  const dest = `https://dest.test:${h.upstream.port}`;
  const secret = `{"password":"${AGENT_SECRET}"}`;
  // Python's gzip skips zero padding between members and decodes the one behind it; node's stops at
  // the padding. zstd decoders read every frame of a body; node's stops after the first.
  const shapes: [string, string, Buffer][] = [
    ['gzip, zero padding, then a member', 'gzip', Buffer.concat([gzipSync('{}'), Buffer.alloc(16), gzipSync(secret)])],
    ['zstd, a second frame', 'zstd', Buffer.concat([zstdCompressSync('{}'), zstdCompressSync(secret)])],
    ['br, bytes after the stream', 'br', Buffer.concat([brotliCompressSync('{}'), Buffer.from(secret)])],
  ];
  for (const [what, coding, body] of shapes) {
    const answer = await request(`${dest}/trailing`, {
      dispatcher: h.proxy(),
      method: 'POST',
      headers: { 'content-encoding': coding },
      body,
    });
    t.equal(answer.statusCode, 415, what);
    t.match(await answer.body.json(), { error: { message: /does not decode/ } }, what);
  }
  t.equal(h.upstream.seen.length, 0, 'none was sent');
  const members = await request(`${dest}/members`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': 'gzip' },
    body: Buffer.concat([gzipSync('{"a":'), gzipSync('1}')]),
  });
  t.equal(members.statusCode, 200, 'gzip members one after the other are one body, decoded whole');
  await members.body.text();
});
