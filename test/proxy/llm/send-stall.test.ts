import t from 'tap';
import { request } from 'undici';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { openTls, parseRawAnswer } from '../../fixtures/raw-tls.ts';

// An agent that asks for a large answer and stops reading it must not hold its connection, nor the
// upstream connection feeding it (the shared pool every tenant uses), for ever (docs/decisions.md, "Idle connections
// are reaped"): with nothing taken for --idle-timeout, the answer is cut, the upstream released, and the record
// says the agent stopped reading. A slow reader that keeps reading is not cut. Real TLS clients that
// pause their socket; the real test upstream, which sees its answer's connection closed. Small bounds;
// the only times asserted are generous "within" bounds.
const IDLE_MS = 2_000;
const h = await startHarness({ proxy: { idleTimeout: IDLE_MS, metricsAddr: '127.0.0.1:0' } });
t.teardown(() => h.close());
const ca = h.ca.certPem;

const metrics = async () =>
  await (await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher })).body.text();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Polls `pick` until it returns something, up to `ms`. */
async function within<T>(
  ms: number,
  pick: () => T | undefined | null | false | Promise<T | false>,
): Promise<T | undefined> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) {
    const v = await pick();
    if (v) return v;
  }
  return undefined;
}

/** A raw HTTP/1.1 request over TLS; the client then stops reading (its socket paused). */
async function askThenStopReading(head: string, body = '') {
  const c = await openTls(h.proxy.port, { ca });
  c.socket.write(`${head}\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  c.socket.pause();
  return {
    /**
     * Whether llmproxy closed the connection within `ms`: its open-connection gauge falls to 0 (a client
     * that reads nothing cannot see the close), then the client reads again and sees the end.
     */
    async closedWithin(ms: number): Promise<boolean> {
      const gone = await within(ms, async () =>
        /dvx_connections_open\{listener="llmproxy"\} 0\b/.test(await metrics()),
      );
      c.socket.resume();
      const seen = await c.closed(10_000);
      return Boolean(gone) && seen.closed;
    },
  };
}

const messages = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], ...extra });

t.test(
  'a large streamed pass-through answer the agent stops reading: connection closed, upstream released, recorded',
  async (t) => {
    const before = h.upstream.received.length;
    const c = await askThenStopReading(
      `GET /v1/files/file-1/content HTTP/1.1\r\nhost: x\r\nx-api-key: ${await h.token()}\r\nx-test-size: ${256 * 1024 * 1024}`,
    );
    t.ok(await c.closedWithin(15_000), 'the agent connection is closed');
    const up = await within(
      10_000,
      () => h.upstream.received[before]?.outcome === 'cut' && h.upstream.received[before],
    );
    t.ok(up, "the upstream saw its answer's connection closed before the end: the connection is released");
    const record = await within(5_000, () => h.audit.find((a) => a.path === '/v1/files/file-1/content'));
    t.match(
      record,
      {
        agent_id: 'agent-1',
        status: 200,
        error: /^the agent stopped reading: none of the answer was taken for 2000 ms \(--idle-timeout\)/,
      },
      'the record says why',
    );
    const text = await metrics();
    t.match(text, /dvx_llmproxy_agent_stalls_total [1-9]/);
    t.match(text, /dvx_connections_open\{listener="llmproxy"\} 0/, 'nothing left open');
  },
);

t.test('a long event stream the agent stops reading: connection closed, upstream released, recorded', async (t) => {
  const before = h.upstream.received.length;
  const body = messages({ stream: true });
  const c = await askThenStopReading(
    `POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\nx-test-reply-bytes: 65536\r\nx-test-stream-repeat: 4000\r\nx-test-event-gap: 0`,
    body,
  );
  t.ok(await c.closedWithin(15_000), 'the agent connection is closed');
  t.ok(
    await within(10_000, () => h.upstream.received[before]?.outcome === 'cut'),
    'the upstream stream was cut: its connection is released',
  );
  const record = await within(5_000, () =>
    h.audit.find(
      (a) =>
        a.path === '/v1/messages' && typeof a.error === 'string' && a.error.startsWith('the agent stopped reading'),
    ),
  );
  t.match(
    record,
    { agent_id: 'agent-1', status: 200, upstream_status: 200 },
    'recorded, saying the agent stopped reading',
  );
});

t.test('a large plain answer the agent stops reading: connection closed by the listener, recorded', async (t) => {
  const before = h.upstream.received.length;
  const auditBefore = h.audit.length;
  const c = await askThenStopReading(
    `POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\nx-test-reply-bytes: ${24 * 1024 * 1024}`,
    messages(),
  );
  t.ok(await c.closedWithin(20_000), 'the agent connection is closed');
  // A plain answer is held whole before it is replayed (proxy.ts): the upstream finished long before.
  t.equal(h.upstream.received[before]?.outcome, 'finished');
  t.ok(
    await within(5_000, () => h.audit.slice(auditBefore).find((a) => a.path === '/v1/messages' && a.status === 200)),
    'its record was written before the answer left',
  );
  // Written in pieces through send(): llmproxy's own bound or the listener's, whichever fires first.
  const text = await metrics();
  t.ok(
    /dvx_connections_reaped_total\{listener="llmproxy",reason="send_stall"\} [1-9]/.test(text) ||
      /dvx_llmproxy_agent_stalls_total [1-9]/.test(text),
    'the stall is counted',
  );
});

t.test('a slow reader that keeps reading gets the whole answer', async (t) => {
  const size = 32 * 1024 * 1024;
  const before = h.upstream.received.length;
  const c = await openTls(h.proxy.port, { ca });
  let got = 0;
  c.socket.on('data', (d: Buffer) => {
    got += d.length;
    // About 512 KB per turn, a turn every 250 ms: the answer takes several idle bounds to arrive, and
    // each bound sees more than the server's socket buffer leave it (a write completes: progress).
    if (got % (512 * 1024) < d.length) c.socket.pause();
  });
  c.socket.write(
    `GET /v1/files/file-2/content HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-api-key: ${await h.token()}\r\nx-test-size: ${size}\r\n\r\n`,
  );
  const turns = setInterval(() => c.socket.resume(), 250);
  // Waits for the close (a pending 120 s sleep here kept the process alive past the file's timeout).
  const r = await c.closed(120_000);
  clearInterval(turns);
  t.ok(got > size, `the whole answer arrived (${got} bytes with its head)`);
  t.equal(parseRawAnswer(r.text.slice(0, 2048)).status, 200);
  t.equal(h.upstream.received[before]?.outcome, 'finished', 'the upstream answered to the end');
  t.match(
    h.audit.find((a) => a.path === '/v1/files/file-2/content'),
    { status: 200, error: null },
  );
});
