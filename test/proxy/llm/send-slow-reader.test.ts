import t from 'tap';
import { request } from 'undici';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { openTls, parseRawAnswer } from '../../fixtures/raw-tls.ts';

// A steady slow reader of a large answer is not mistaken for one that stopped reading (the other side of
// send-stall.test.ts). Progress is a piece of the answer taken by the agent: a held answer went out as one write, which
// completed only once the agent had taken nearly all of it, so a reader slower than (answer size - socket buffers) /
// --idle-timeout was cut. Real TLS clients pacing their reads, the real test upstream. The bound is 3 s: the kernel
// wakes a sender only once about a third of its send buffer has drained (~1.3 MB), which a 1 MB/s reader takes in about
// 1.3 s (docs/decisions.md, "Idle connections are reaped"). No time is asserted.
const IDLE_MS = 3_000;
const h = await startHarness({ proxy: { idleTimeout: IDLE_MS, metricsAddr: '127.0.0.1:0' } });
t.teardown(() => h.close());
const ca = h.ca.certPem;

const metrics = async () =>
  await (await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher })).body.text();
const messages = () =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });

/**
 * Asks over raw TLS and reads the answer at a steady `rate` (bytes a second: paused whenever ahead of
 * the clock), as a slow agent does; resolves with what arrived once the server closes (`connection: close`).
 */
async function readSteadily(head: string, body: string, rate: number) {
  const c = await openTls(h.proxy.port, { ca });
  let got = 0;
  const started = Date.now();
  c.socket.on('data', (d: Buffer) => {
    got += d.length;
    const ahead = (got / rate) * 1000 - (Date.now() - started);
    if (ahead > 0) {
      c.socket.pause();
      setTimeout(() => c.socket.resume(), ahead);
    }
  });
  c.socket.write(`${head}\r\nconnection: close\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  const r = await c.closed(120_000);
  const headBytes = r.text.indexOf('\r\n\r\n') + 4;
  return {
    bodyBytes: got - headBytes,
    complete: r.closed && r.text.endsWith('\r\n0\r\n\r\n'),
    answer: parseRawAnswer(r.text.slice(0, 4096)),
  };
}

const sendStalls = async () =>
  Number(
    /dvx_connections_reaped_total\{listener="llmproxy",reason="send_stall"\} (\d+)/.exec(await metrics())?.[1] ?? 0,
  );
const agentStalls = async () => Number(/dvx_llmproxy_agent_stalls_total (\d+)/.exec(await metrics())?.[1] ?? 0);

// One write of a held answer completed only once the agent had taken nearly all of it, so a steady
// reader slower than (answer size - socket buffers) / --idle-timeout was cut as if it had stopped.
t.test('a steady slow reader of a large plain (held) answer gets all of it and is not cut', async (t) => {
  const size = 12 * 1024 * 1024;
  const [listenerBefore, agentBefore] = [await sendStalls(), await agentStalls()];
  const r = await readSteadily(
    `POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\nx-test-reply-bytes: ${size}`,
    messages(),
    1024 * 1024,
  );
  t.equal(r.answer.status, 200);
  const length = Number(r.answer.headers['content-length']);
  t.ok(length > size, `the answer is the large one (${length} bytes)`);
  t.equal(r.bodyBytes, length, 'every byte of it arrived');
  t.equal(await sendStalls(), listenerBefore, 'the listener saw no send stall');
  t.equal(await agentStalls(), agentBefore, 'llmproxy saw no stall');
});

t.test('a steady slow reader of a large pass-through answer gets all of it and is not cut', async (t) => {
  const size = 8 * 1024 * 1024;
  const before = h.upstream.received.length;
  const [listenerBefore, agentBefore] = [await sendStalls(), await agentStalls()];
  const r = await readSteadily(
    `GET /v1/files/file-3/content HTTP/1.1\r\nhost: x\r\nx-api-key: ${await h.token()}\r\nx-test-size: ${size}`,
    '',
    1024 * 1024,
  );
  t.equal(r.answer.status, 200);
  // Relayed with chunked encoding (the upstream's length is not kept): its framing counts too.
  t.ok(r.bodyBytes >= size && r.complete, `every byte of it arrived (${r.bodyBytes} bytes with the chunk framing)`);
  t.equal(h.upstream.received[before]?.outcome, 'finished', 'the upstream answered to the end');
  t.equal(await sendStalls(), listenerBefore, 'the listener saw no send stall');
  t.equal(await agentStalls(), agentBefore, 'llmproxy saw no stall');
  t.match(
    h.audit.find((a) => a.path === '/v1/files/file-3/content'),
    { status: 200, error: null },
  );
});
