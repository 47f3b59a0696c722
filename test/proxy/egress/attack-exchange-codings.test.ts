import { brotliCompressSync, gzipSync } from 'node:zlib';
import t from 'tap';
import { request } from 'undici';
import { decodeBody } from '../../../proxy/egress/body-coding.ts';
import { startHarness } from './intercept-harness.ts';

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
