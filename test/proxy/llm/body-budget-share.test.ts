import { connect, type TLSSocket } from 'node:tls';
import t from 'tap';
import { request } from 'undici';
import { MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import { ERRORS } from '../../../proxy/llm/errors.ts';
import type { LlmProxyOptions } from '../../../proxy/llm/options.ts';
import { until } from '../../fixtures/eventually.ts';
import { baseSnapshot, type Harness, PLATFORM_KEY, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The bodies llmproxy holds at once (core/body-budget.ts) count the bytes that arrived, never a length
// merely announced, and no agent holds more than its share (--max-buffered-bodies-per-agent, half the
// budget by default): agents that announce 32 MB and trickle it do not deny service to the others, and
// whatever a body took is given back however its call ends (docs/decisions.md, "The body budget takes
// bytes as they arrive"). Real proxies over TLS, raw sockets for the trickling agents.

t.setTimeout(120_000);
const AGENTS = ['agent-1', 'agent-2', 'agent-3'];

function snapshot(url: string) {
  const s = baseSnapshot(url) as { agents: Record<string, unknown> };
  for (const a of AGENTS)
    s.agents[a] = { org_id: 'org-1', group_id: 'g-1', name: a, status: 'active', contained: false, config: {} };
  return s;
}
const secrets = Object.fromEntries(AGENTS.map((a) => [`agent:${a}`, { 'agent:llmproxy.llm.api_key': PLATFORM_KEY }]));

async function start(proxy: Partial<LlmProxyOptions>) {
  const h = await startHarness({ snapshot, secrets, proxy: { metricsAddr: '127.0.0.1:0', ...proxy } });
  t.teardown(() => h.close());
  return h;
}

/** dvx_llmproxy_buffered_body_bytes, scraped from the metrics listener. */
async function held(h: Harness): Promise<number> {
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

/** A call of `size` bytes as `agent`, announced or (`chunked`) not. */
async function call(h: Harness, agent: string, size: number, chunked = false) {
  const before = h.audit.length;
  const body = bodyOf(size);
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token({ sub: agent }) },
    body: chunked
      ? ((async function* () {
          for (let at = 0; at < body.length; at += 4096) yield body.subarray(at, at + 4096);
        })() as never)
      : body,
  });
  await until(() => h.audit.length > before);
  return { ...r, records: h.audit.slice(before) };
}

/** An agent that announces `announced` bytes and sends only `sent` of them (a raw TLS socket). */
async function trickle(h: Harness, agent: string, announced: number, sent: number) {
  const socket: TLSSocket = connect({
    host: '127.0.0.1',
    port: h.proxy.port,
    ca: h.ca.certPem,
    servername: 'localhost',
  });
  await new Promise((resolve) => socket.once('secureConnect', resolve));
  socket.on('error', () => undefined);
  let answer = '';
  socket.on('data', (d: Buffer) => (answer += d));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  t.teardown(() => socket.destroy());
  socket.write(
    `POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nx-api-key: ${await h.token({ sub: agent })}\r\ncontent-length: ${announced}\r\n\r\n`,
  );
  const body = bodyOf(announced);
  socket.write(body.subarray(0, sent));
  return {
    socket,
    closed,
    answer: () => answer,
    /** Sends the rest and resolves with the answer's status line once it came. */
    async finish(): Promise<string> {
      socket.write(body.subarray(sent));
      await until(() => /\r\n\r\n/.test(answer));
      return answer.slice(0, answer.indexOf('\r\n'));
    },
  };
}

t.test('two agents trickling 32 MB bodies do not stop a third agent', async (t) => {
  const h = await start({}); // the defaults: 64 MiB held at once, 32 MiB per agent
  const a = await trickle(h, 'agent-1', MAX_BODY_BYTES, 1000);
  const b = await trickle(h, 'agent-2', MAX_BODY_BYTES, 1000);
  t.ok(await until(async () => (await held(h)) === 2000), 'what is held is what arrived: 2 × 1,000 bytes');
  const c = await call(h, 'agent-3', 4096);
  t.equal(c.status, 200, "the third agent's 4 KB call is served");
  t.equal(await held(h), 2000, 'and gave back what it took');
  a.socket.destroy();
  b.socket.destroy();
  t.ok(await until(async () => (await held(h)) === 0), 'the reset bodies gave back what they took');
});

t.test('one agent holds no more than its share; the others still fit', async (t) => {
  const h = await start({ maxBufferedBodies: 100_000 }); // 50,000 per agent
  const a = await trickle(h, 'agent-1', 48_000, 45_000);
  t.ok(await until(async () => (await held(h)) === 45_000));

  const refused = await call(h, 'agent-1', 10_000);
  t.equal(refused.status, 503, "45,000 + 10,000 announced passes agent-1's 50,000: refused before it is read");
  t.equal(refused.headers['retry-after'], '1');
  t.equal(refused.headers['content-type'], ERRORS.overloaded.contentType);
  t.not(refused.headers.connection, 'close', 'the body is drained, the connection kept');
  t.equal(refused.text, ERRORS.overloaded.body.toString(), 'the answer of today');
  t.match(refused.records[0], {
    agent_id: 'agent-1',
    status: 503,
    decision: 'deny',
    error:
      /a body of 10000 bytes does not fit in the agent's share of 50000 bytes .*--max-buffered-bodies-per-agent; 45000 held by it/,
  });

  t.equal((await call(h, 'agent-2', 10_000)).status, 200, 'another agent, in the same budget, is served');

  const cut = await call(h, 'agent-1', 10_000, true);
  t.equal(cut.status, 503, 'a chunked body is cut once it passes the share');
  t.equal(cut.headers['retry-after'], '1');
  t.equal(cut.headers.connection, 'close');
  t.match(cut.records[0], { status: 503, error: /--max-buffered-bodies-per-agent/ });
  t.ok(await until(async () => (await held(h)) === 45_000), 'the cut body gave back what it took');

  t.match(await a.finish(), /^HTTP\/1\.1 200/, 'the held call is served once whole');
  t.ok(await until(async () => (await held(h)) === 0));
  t.equal((await call(h, 'agent-1', 40_000)).status, 200, 'its share is free again');
});

t.test('the whole budget still bounds the agents together', async (t) => {
  const h = await start({ maxBufferedBodies: 100_000 });
  const a = await trickle(h, 'agent-1', 48_000, 45_000);
  const b = await trickle(h, 'agent-2', 48_000, 45_000);
  t.ok(await until(async () => (await held(h)) === 90_000));
  const refused = await call(h, 'agent-3', 15_000);
  t.equal(refused.status, 503);
  t.equal(refused.text, ERRORS.overloaded.body.toString());
  t.match(refused.records[0], { error: /does not fit in the 100000 bytes .*--max-buffered-bodies; 90000 held/ });
  t.equal((await call(h, 'agent-3', 5_000)).status, 200, 'what fits in the rest is served');
  a.socket.destroy();
  b.socket.destroy();
  t.ok(await until(async () => (await held(h)) === 0));
});

t.test('what a body took is given back when it is reset, abandoned or times out', async (t) => {
  const h = await start({ maxBufferedBodies: 100_000, requestTimeout: 3000, headersTimeout: 1000 });
  const reset = await trickle(h, 'agent-1', 40_000, 20_000);
  t.ok(await until(async () => (await held(h)) === 20_000));
  reset.socket.destroy();
  t.ok(await until(async () => (await held(h)) === 0), 'reset');

  const ended = await trickle(h, 'agent-1', 40_000, 20_000);
  t.ok(await until(async () => (await held(h)) === 20_000));
  ended.socket.end();
  t.ok(await until(async () => (await held(h)) === 0), 'the client closed its side mid-body');

  const slow = await trickle(h, 'agent-2', 40_000, 20_000);
  t.ok(await until(async () => (await held(h)) === 20_000));
  const started = Date.now();
  await slow.closed;
  t.ok(Date.now() - started < 10_000, 'cut by --request-timeout');
  t.ok(await until(async () => (await held(h)) === 0), 'timed out');
  t.equal((await call(h, 'agent-2', 40_000)).status, 200, 'nothing leaked: its whole share fits');
});
