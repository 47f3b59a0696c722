import t from 'tap';
import { MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { GatewayOptions } from '../../../proxy/egress/options.ts';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT, type Harness, startHarness } from './intercept-harness.ts';
import { openTunnel } from './intercept-tunnel.ts';

// The gateway's request bodies held for inspection (core/body-budget.ts) count the bytes that
// arrived, never a length merely announced, and no agent (known at the tunnel's admission) holds more
// than its share (--max-buffered-bodies-per-agent, half the budget by default): agents that announce
// 32 MB and trickle it do not deny service to the others, and whatever an exchange's body took is
// given back however it ends (docs/decisions.md, "The body budget takes bytes as they arrive").

t.setTimeout(120_000);

async function start(options: Partial<GatewayOptions>) {
  const h = await startHarness({ options });
  t.teardown(() => h.close());
  return h;
}

async function held(h: Harness): Promise<number> {
  return (await h.deps.metrics.bufferedBodies.get()).values[0]?.value ?? 0;
}

/** A tunnel to dest.test opened as `agent`; its text comes back in `text()`. */
async function tunnel(h: Harness, agent: string) {
  h.identity = { ...AGENT, agentId: agent };
  const tun = await openTunnel(h, 'dest.test', h.upstream.port);
  h.identity = AGENT;
  const socket = tun.tls!;
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.on('error', () => undefined);
  t.teardown(() => socket.destroy());
  const host = `dest.test:${h.upstream.port}`;
  return {
    socket,
    text: () => text,
    /** Sends a POST announcing `announced` bytes, and the first `sent` of them. */
    post(path: string, announced: number, sent = announced) {
      socket.write(`POST ${path} HTTP/1.1\r\nHost: ${host}\r\nContent-Length: ${announced}\r\n\r\n`);
      socket.write('x'.repeat(sent));
    },
    async answer() {
      await until(() => /\r\n\r\n(ok|\{.*\})$/.test(text));
      return parseRawAnswer(text);
    },
  };
}

t.test('two agents trickling 32 MB bodies do not stop a third agent', async (t) => {
  const h = await start({ maxBufferedBodies: 2 * MAX_BODY_BYTES }); // 32 MiB per agent
  const a = await tunnel(h, 'agent-1');
  const b = await tunnel(h, 'agent-2');
  a.post('/a', MAX_BODY_BYTES, 1000);
  b.post('/b', MAX_BODY_BYTES, 1000);
  t.ok(await until(async () => (await held(h)) === 2000), 'what is held is what arrived: 2 × 1,000 bytes');
  const c = await tunnel(h, 'agent-3');
  c.post('/c', 4096);
  t.equal((await c.answer()).status, 200, "the third agent's 4 KB request is sent");
  t.ok(await until(async () => (await held(h)) === 2000), 'and gave back what it took');
  a.socket.destroy();
  b.socket.destroy();
  t.ok(await until(async () => (await held(h)) === 0), 'the reset bodies gave back what they took');
});

t.test('one agent holds no more than its share; the others still fit', async (t) => {
  const h = await start({ maxBufferedBodies: 1_000_000 }); // 500,000 per agent
  const before = h.upstream.seen.length;
  const a = await tunnel(h, 'agent-1');
  a.post('/held', 480_000, 450_000);
  t.ok(await until(async () => (await held(h)) === 450_000));

  const refused = await tunnel(h, 'agent-1');
  refused.post('/over', 100_000, 0);
  const answer = await refused.answer();
  t.equal(answer.status, 503, "450,000 + 100,000 announced passes agent-1's share: refused before it is read");
  t.match(JSON.parse(answer.body), { error: { type: 'overloaded_error' } });
  t.ok(
    await until(() =>
      h.flows().some((f) => /--max-buffered-bodies-per-agent/.test(String(f.reason)) && f.outcome === 'deny'),
    ),
    'its record says which bound refused it',
  );

  const other = await tunnel(h, 'agent-2');
  other.post('/other', 100_000);
  t.equal((await other.answer()).status, 200, 'another agent, in the same budget, is sent');

  const cut = await tunnel(h, 'agent-1');
  cut.socket.write(`POST /cut HTTP/1.1\r\nHost: dest.test:${h.upstream.port}\r\nTransfer-Encoding: chunked\r\n\r\n`);
  const chunk = 'c'.repeat(20_000);
  for (let i = 0; i < 4 && !cut.socket.destroyed; i++) cut.socket.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
  t.ok(
    await until(() => cut.socket.destroyed || /\r\n\r\n\{/.test(cut.text())),
    'a chunked body past the share is cut',
  );
  t.notMatch(cut.text(), /^HTTP\/1\.1 200/);
  t.ok(await until(async () => (await held(h)) === 450_000), 'the cut body gave back what it took');

  a.socket.write('x'.repeat(30_000));
  t.equal((await a.answer()).status, 200, 'the held body is sent once whole');
  t.ok(await until(async () => (await held(h)) === 0));
  t.same(
    h.upstream.seen.slice(before).map((s) => [s.url, s.body.length]),
    [
      ['/other', 100_000],
      ['/held', 480_000],
    ],
    'neither refused body was sent',
  );
});

t.test('a body that does not arrive within --request-timeout gives back what it took', async (t) => {
  const h = await start({ maxBufferedBodies: 1_000_000, requestTimeout: 3000, headersTimeout: 1000 });
  const slow = await tunnel(h, 'agent-1');
  slow.post('/slow', 400_000, 200_000);
  t.ok(await until(async () => (await held(h)) === 200_000));
  const started = Date.now();
  t.ok(await until(async () => (await held(h)) === 0, 15_000), 'given back');
  t.ok(Date.now() - started < 10_000, 'cut by --request-timeout');
});
