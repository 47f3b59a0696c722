import t from 'tap';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { startHarness } from './intercept-harness.ts';
import { openTunnel } from './intercept-tunnel.ts';

// The request bodies held for inspection, over every connection: each connection holds at most one
// (pipelining), but 256 connections of one agent holding 32 MB each would be 8 GB. Past
// --max-buffered-bodies a body is refused (503) rather than held; what an exchange held is given back
// when it ends. Bytes are held as they arrive; an announced length is checked against what is free.
// All of the budget is the one agent's share here (the share: body-budget-share.test.ts).

t.setTimeout(60_000);
const BUDGET = 1_000_000;
const h = await startHarness({ options: { maxBufferedBodies: BUDGET, maxBufferedBodiesPerAgent: BUDGET } });
t.teardown(() => h.close());
const up = h.upstream;
const host = `dest.test:${up.port}`;

async function held(): Promise<number> {
  return (await h.deps.metrics.bufferedBodies.get()).values[0]?.value ?? 0;
}

/** A tunnel whose text comes back in `text()`. */
async function tunnel() {
  const tun = await openTunnel(h, 'dest.test', up.port);
  const socket = tun.tls!;
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.on('error', () => undefined);
  t.teardown(() => socket.destroy());
  return { socket, text: () => text };
}

t.test('an announced body that does not fit is refused 503 before it is read; room comes back', async (t) => {
  const before = up.seen.length;
  const a = await tunnel();
  a.socket.write(`POST /a HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 800000\r\n\r\n${'a'.repeat(750_000)}`);
  t.ok(await until(async () => (await held()) === 750_000), 'the first body holds what arrived of it');

  const b = await tunnel();
  b.socket.write(`POST /b HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 300000\r\n\r\n`);
  t.ok(await until(() => /\r\n\r\n\{.*\}$/.test(b.text())), 'answered without its body');
  const refused = parseRawAnswer(b.text());
  t.equal(refused.status, 503);
  t.equal(refused.headers.connection, 'close');
  t.match(JSON.parse(refused.body), { error: { type: 'overloaded_error' } });

  a.socket.write('a'.repeat(50_000));
  t.ok(await until(() => /\r\n\r\nok$/.test(a.text())), 'the first one, once whole, is sent');
  t.ok(await until(async () => (await held()) === 0), 'and its room given back');
  const c = await tunnel();
  c.socket.write(`POST /c HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 300000\r\n\r\n${'c'.repeat(300_000)}`);
  t.ok(await until(() => /\r\n\r\nok$/.test(c.text())), 'a body that fits now is sent');
  t.same(
    up.seen.slice(before).map((s) => [s.url, s.body.length]),
    [
      ['/a', 800_000],
      ['/c', 300_000],
    ],
  );
});

t.test('a chunked body is counted as it comes: past the budget it is cut, never sent', async (t) => {
  const before = up.seen.length;
  const a = await tunnel();
  a.socket.write(`POST /ca HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 900000\r\n\r\n${'a'.repeat(850_000)}`);
  t.ok(await until(async () => (await held()) === 850_000));
  const b = await tunnel();
  const chunk = 'b'.repeat(50_000);
  b.socket.write(`POST /cb HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked\r\n\r\n`);
  for (let i = 0; i < 4 && !b.socket.destroyed; i++) b.socket.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
  t.ok(await until(() => b.socket.destroyed || /\r\n\r\n\{/.test(b.text())), 'refused');
  t.notMatch(b.text(), /^HTTP\/1\.1 200/);
  a.socket.destroy();
  t.ok(await until(async () => (await held()) === 0), 'everything given back once both ended');
  t.equal(up.seen.length, before, 'neither was sent');
});
