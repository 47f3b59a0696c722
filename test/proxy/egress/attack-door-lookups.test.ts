import t from 'tap';
import type { Lookup } from '../../../proxy/egress/resolve.ts';
import { lookupConcurrency, MAX_WAITING_PER_AGENT } from '../../../proxy/egress/lookup-limits.ts';
import { until } from '../../fixtures/eventually.ts';
import { connectRequest, flows, holdConnection } from './door-clients.ts';
import { parseAnswer, rawExchange, startEcho, startGatewayHarness } from './gateway-harness.ts';

// An attacker's review: names whose servers never answer must not fill libuv's thread pool (which
// dns.lookup shares with every file system call of the process). The gateway runs at most half the
// pool's lookups at once (2 by default), one per agent; the rest wait within --connect-timeout (504
// past it) and a bounded queue (503 past it). A lookup whose caller gave up keeps its slot until the
// resolver returns, since its thread is busy until then.

const echo = await startEcho();
t.teardown(() => echo.close());

/** Names under hang.test never answer until released; the lookups running now are counted. */
let running = 0;
let peak = 0;
const hung: (() => void)[] = [];
const lookup: Lookup = async (host) => {
  running++;
  peak = Math.max(peak, running);
  try {
    if (host.endsWith('.hang.test')) await new Promise<void>((resolve) => hung.push(resolve));
    return [{ address: '127.0.0.1', family: 4 }];
  } finally {
    running--;
  }
};
const h = await startGatewayHarness({ lookup, gateway: { connectTimeout: 1_000 } });
t.teardown(async () => {
  for (const release of hung) release();
  await h.close();
});

const connect = async (authority: string, token: string) => {
  const r = await rawExchange(h, connectRequest(authority, token), 10_000, {}, (got) => got.includes('\r\n\r\n'));
  return parseAnswer(r.text);
};

t.test('the pool bound: half of UV_THREADPOOL_SIZE, at least one', async (t) => {
  t.equal(lookupConcurrency({}), 2, 'the default pool of 4: 2');
  t.equal(lookupConcurrency({ UV_THREADPOOL_SIZE: '16' }), 8);
  t.equal(lookupConcurrency({ UV_THREADPOOL_SIZE: '1' }), 1);
  t.equal(lookupConcurrency({ UV_THREADPOOL_SIZE: 'lots' }), 2, 'unreadable: libuv’s default');
});

t.test('one agent’s hanging names hold one lookup at a time; its others wait, then 504', async (t) => {
  const token = await h.token();
  const asked = h.lookups.length;
  const first = connect(`a.hang.test:${echo.port}`, token);
  await until(() => running === 1);
  const second = await connect(`b.hang.test:${echo.port}`, token);
  t.equal(second.status, 504, 'the second waited for the agent’s running lookup, past --connect-timeout');
  t.same(h.lookups.slice(asked), ['a.hang.test'], 'the second name was never handed to the resolver');
  t.equal((await first).status, 504);
  t.equal(running, 1, 'the abandoned lookup still holds its slot (its thread is still busy)');
});

t.test('every slot held by hanging names: another agent waits, then gets through once they return', async (t) => {
  const other = await h.token({ sub: 'agent-2', org_id: 'org-1' });
  const third = await h.token({ sub: 'agent-3', org_id: 'org-1' });
  const held = connect(`c.hang.test:${echo.port}`, other);
  await until(() => running === 2);
  t.equal((await connect(`ok.test:${echo.port}`, third)).status, 504, 'no slot: a third agent’s lookup waits');
  t.equal(peak, 2, 'never more than two lookups at once');
  // A third agent asks again; the hanging lookups return while it waits: it runs and gets its tunnel.
  const before = flows(h).length;
  const tunnel = holdConnection(h, connectRequest(`ok.test:${echo.port}`, third));
  t.ok(await until(() => h.gw.lookups.waiting === 1), 'it waits for a slot');
  t.equal(h.lookups.filter((n) => n === 'ok.test').length, 0, 'not handed to the resolver while it waits');
  for (const release of hung.splice(0)) release();
  const c = await tunnel;
  t.equal(c.status, 200, 'the slot freed, the waiting lookup ran');
  c.socket.end();
  await c.closed;
  t.equal((await held).status, 504);
  t.ok(await until(() => flows(h).length > before));
  t.equal(peak, 2, 'never more than two lookups at once');
});

t.test('an agent’s queue is bounded: past it, refused 503 at once', async (t) => {
  const token = await h.token({ sub: 'agent-4', org_id: 'org-1' });
  const first = connect(`d.hang.test:${echo.port}`, token);
  await until(() => running === 1);
  const waiting = Array.from({ length: MAX_WAITING_PER_AGENT }, (_, i) =>
    connect(`w${i}.hang.test:${echo.port}`, token),
  );
  t.ok(await until(() => h.gw.lookups.waiting === MAX_WAITING_PER_AGENT), 'its next lookups wait');
  const over = await connect(`x.hang.test:${echo.port}`, token);
  t.equal(over.status, 503, 'the one past the bound is refused');
  t.match(JSON.parse(over.body), { error: { type: 'overloaded_error' } });
  const refused = flows(h).filter(
    (r) => r.agent_id === 'agent-4' && r.attrs && (r.attrs as { status: string }).status === '503',
  );
  t.match(refused[0], {
    outcome: 'deny',
    reason: /^name lookups at capacity: this agent already has 4 name lookups waiting/,
  });
  for (const w of await Promise.all(waiting)) t.equal(w.status, 504);
  t.equal((await first).status, 504);
  for (const release of hung.splice(0)) release();
});
