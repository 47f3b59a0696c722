import t from 'tap';
import { RefusalMemory } from '../../../../proxy/llm/tools/refusal-memory.ts';

// The refused-calls memory on its own: keyed by (agent, answer), least recently used first out past
// its answer and byte bounds, forgotten after its ttl, safe with keys that are prototype names.

const refusal = (callId: string, message = `[dvx] The tool call rm (id ${callId}) was not run: no.`) => ({
  callId,
  tool: 'rm',
  message,
});

t.test('remembers per agent and answer', async (t) => {
  const m = new RefusalMemory();
  t.notOk(m.holdsAgent('agent-1'));
  m.remember('agent-1', 'msg_1', [refusal('toolu_2')]);
  t.ok(m.holdsAgent('agent-1'));
  t.notOk(m.holdsAgent('agent-2'));
  t.same(m.recall('agent-1', 'msg_1'), [refusal('toolu_2')]);
  t.equal(m.recall('agent-2', 'msg_1'), null, "another agent's key");
  t.equal(m.recall('agent-1', 'msg_2'), null);
  // The pair is one unambiguous key: an agent id that ends like another's answer id does not collide.
  m.remember('a', 'bc', [refusal('x')]);
  t.equal(m.recall('ab', 'c'), null);
  // Nothing to remember: no entry.
  m.remember('agent-3', 'msg_1', []);
  m.remember('agent-3', '', [refusal('y')]);
  t.notOk(m.holdsAgent('agent-3'));
  // A copy is kept: the caller's array may change afterwards.
  const list = [refusal('toolu_9')];
  m.remember('agent-1', 'msg_9', list);
  list[0].message = 'changed';
  t.match(m.recall('agent-1', 'msg_9'), [{ message: /was not run/ }]);
});

t.test('keys that are prototype names are plain keys', async (t) => {
  const m = new RefusalMemory();
  for (const k of ['__proto__', 'constructor', 'hasOwnProperty', 'toString', 'valueOf']) {
    t.equal(m.recall(k, k), null, `${k}: nothing`);
    t.notOk(m.holdsAgent(k));
    m.remember(k, k, [refusal(k)]);
    t.same(m.recall(k, k), [refusal(k)]);
  }
  t.equal(({} as Record<string, unknown>).callId, undefined, 'nothing polluted');
});

t.test('bounded by answers: the least recently used goes first', async (t) => {
  const m = new RefusalMemory({ maxAnswers: 3 });
  for (const id of ['a', 'b', 'c']) m.remember('agent-1', id, [refusal(id)]);
  t.ok(m.recall('agent-1', 'a'), 'a used: now the most recent');
  m.remember('agent-1', 'd', [refusal('d')]);
  t.equal(m.size, 3);
  t.equal(m.evictions, 1);
  t.equal(m.recall('agent-1', 'b'), null, 'b, the least recently used, is gone');
  for (const id of ['a', 'c', 'd']) t.ok(m.recall('agent-1', id), `${id} kept`);
  // More refusals of an answer are added to it (a stream reports them one by one), no second entry;
  // a call remembered again replaces its first record.
  m.remember('agent-1', 'd', [refusal('d2')]);
  t.equal(m.size, 3);
  t.same(m.recall('agent-1', 'd'), [refusal('d'), refusal('d2')]);
  m.remember('agent-1', 'd', [refusal('d', 'again')]);
  t.same(m.recall('agent-1', 'd'), [refusal('d2'), refusal('d', 'again')]);
});

t.test('bounded by bytes', async (t) => {
  const big = 'x'.repeat(10_000);
  const m = new RefusalMemory({ maxBytes: 50_000 });
  for (let i = 0; i < 5; i++) m.remember('agent-1', `m${i}`, [refusal(`c${i}`, big)]);
  t.ok(m.bytes <= 50_000, `within the bound (${m.bytes})`);
  t.equal(m.recall('agent-1', 'm0'), null, 'the oldest went');
  t.ok(m.recall('agent-1', 'm4'));
  // One answer larger than the whole budget is not remembered, and evicts nothing.
  const before = m.size;
  m.remember('agent-1', 'huge', [refusal('h', 'y'.repeat(60_000))]);
  t.equal(m.recall('agent-1', 'huge'), null);
  t.equal(m.size, before);
  // The per-agent count follows evictions: an agent whose answers all went holds nothing.
  const one = new RefusalMemory({ maxAnswers: 1 });
  one.remember('agent-1', 'a', [refusal('a')]);
  one.remember('agent-2', 'b', [refusal('b')]);
  t.notOk(one.holdsAgent('agent-1'));
  t.ok(one.holdsAgent('agent-2'));
});

t.test('forgotten after the ttl', async (t) => {
  let now = 1_000;
  const m = new RefusalMemory({ ttlMs: 100, now: () => now });
  m.remember('agent-1', 'a', [refusal('a')]);
  now += 50;
  m.remember('agent-1', 'b', [refusal('b')]);
  t.ok(m.recall('agent-1', 'a'));
  now += 60; // a: 110 ms old, b: 60
  t.equal(m.recall('agent-1', 'a'), null, 'expired');
  t.ok(m.recall('agent-1', 'b'));
  now += 100;
  m.remember('agent-1', 'c', [refusal('c')]);
  t.equal(m.size, 1, 'expired entries at the old end go when another is remembered');
  t.notOk(m.recall('agent-1', 'b'));
});
