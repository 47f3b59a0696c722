import { connect } from 'node:tls';
import t from 'tap';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';

// Admission under overload (core/body-budget.ts, --max-buffered-bodies): the request bodies held
// at once are bounded; a call whose body does not fit is answered 503 overloaded_error with
// retry-after (the official SDKs retry it), recorded in the audit log like every refusal, and the
// budget is given back when each call ends. Here a 100 KB budget, all of it one agent's share (the
// share is test/proxy/llm/body-budget-share.test.ts), and a first call that holds 79 KB of it by
// sending its headers and only part of its body (bytes are held as they arrive).
const BUDGET = 100_000;
const h = await startHarness({
  proxy: { maxBufferedBodies: BUDGET, maxBufferedBodiesPerAgent: BUDGET, metricsAddr: '127.0.0.1:0' },
});
t.teardown(() => h.close());

/** dvx_llmproxy_buffered_body_bytes, scraped from the metrics listener. */
async function held(): Promise<number> {
  const res = await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher });
  const line = (await res.body.text()).split('\n').find((l) => l.startsWith('dvx_llmproxy_buffered_body_bytes '));
  return Number(line?.slice(line.lastIndexOf(' ') + 1) ?? Number.NaN);
}

/** An Anthropic body of exactly `size` bytes. */
function bodyOf(size: number): Buffer {
  const head = '{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"';
  const tail = '"}]}';
  return Buffer.from(head + 'x'.repeat(size - head.length - tail.length) + tail);
}

async function call(size: number, chunked = false) {
  const before = h.audit.length;
  const body = bodyOf(size);
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    // A generator body has no announced length: undici sends it chunked.
    body: chunked
      ? ((async function* () {
          for (let at = 0; at < body.length; at += 16_384) yield body.subarray(at, at + 16_384);
        })() as never)
      : body,
  });
  await until(() => h.proxy.proxy.inFlight <= (holding ? 1 : 0));
  return { ...r, records: h.audit.slice(before) };
}

let holding = false;

/** Starts a call of `size` bytes that sends all but its last 1,000 bytes; `finish` sends them and reads the answer. */
async function holdCall(size: number) {
  const body = bodyOf(size);
  const socket = connect({ host: '127.0.0.1', port: h.proxy.port, ca: h.ca.certPem, servername: 'localhost' });
  await new Promise((resolve) => socket.once('secureConnect', resolve));
  let answer = '';
  socket.on('data', (d: Buffer) => (answer += d));
  socket.write(
    `POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nx-api-key: ${await h.token()}\r\ncontent-length: ${size}\r\nconnection: close\r\n\r\n`,
  );
  socket.write(body.subarray(0, size - 1000));
  holding = true;
  return {
    async finish() {
      // Not end(): a half-closed client is one the server may close on before answering. The answer
      // ends the connection (connection: close).
      socket.write(body.subarray(size - 1000));
      await new Promise((resolve) => socket.once('close', resolve));
      holding = false;
      return answer;
    },
  };
}

t.test('a body that fits is served; one past what is held at once is refused 503, audited, then served', async (t) => {
  t.equal((await call(40_000)).status, 200, 'alone, 40 KB fits');
  const slow = await holdCall(80_000);
  t.ok(await until(async () => (await held()) === 79_000), 'what arrived of it is held');

  const refused = await call(40_000);
  t.equal(refused.status, 503, '79 KB held + 40 KB announced > 100 KB: refused');
  t.equal(refused.headers['retry-after'], '1', 'retry-after');
  t.match(JSON.parse(refused.text), { type: 'error', error: { type: 'overloaded_error' } });
  t.equal(refused.records.length, 1, 'the refusal has its record');
  t.match(refused.records[0], {
    table: 'llm_audit_log',
    agent_id: 'agent-1',
    status: 503,
    decision: 'deny',
    error: /overloaded: a body of 40000 bytes does not fit.*--max-buffered-bodies; 79000 held/,
  });

  const chunked = await call(40_000, true);
  t.equal(chunked.status, 503, 'a chunked body is refused once it passes the budget');
  t.match(chunked.records[0], { status: 503, decision: 'deny', error: /overloaded/ });

  t.equal((await call(15_000)).status, 200, '79 KB + 15 KB fits');

  const answer = await slow.finish();
  t.match(answer, /^HTTP\/1\.1 200/, 'the held call is answered once its body is whole');
  await until(() => h.proxy.proxy.inFlight === 0);
  t.equal((await call(40_000)).status, 200, 'its 80 KB given back: 40 KB fits again');
  t.equal((await call(40_000, true)).status, 200, 'and a chunked one');
  t.equal((await call(BUDGET + 1)).status, 503, 'a body larger than the whole budget is refused');
});

t.test('--max-buffered-bodies must be a positive byte count', async (t) => {
  const { validateOptions } = await import('../../../proxy/llm/options.ts');
  const base = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.throws(() => validateOptions({ ...base, maxBufferedBodies: 0 }), /--max-buffered-bodies/);
  t.throws(() => validateOptions({ ...base, maxBufferedBodies: 1.5 }), /--max-buffered-bodies/);
  t.equal(validateOptions(base).maxBufferedBodies, 64 * 1024 * 1024, 'default 64 MiB');
});
