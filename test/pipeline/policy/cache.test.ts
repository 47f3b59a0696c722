import t from 'tap';
import { PolicyCache, POLICY_CACHE_TTL_MS } from '../../../pipeline/policy/cache.ts';

t.test('cached per (org, agent) for 30 s, then reloaded', async (t) => {
  t.equal(POLICY_CACHE_TTL_MS, 30_000);
  let now = 0;
  let loads = 0;
  const cache = new PolicyCache<number>({ now: () => now });
  const load = () => ++loads;
  t.equal(await cache.get('o', 'a', load), 1);
  t.equal(await cache.get('o', 'a', load), 1);
  t.equal(await cache.get('o', 'b', load), 2, 'another agent is another entry');
  now = 29_999;
  t.equal(await cache.get('o', 'a', load), 1);
  now = 30_000;
  t.equal(await cache.get('o', 'a', load), 3, 'expired');
});

t.test('invalidation by agent, by org, or everything', async (t) => {
  let loads = 0;
  const cache = new PolicyCache<number>();
  const load = () => ++loads;
  await cache.get('o1', 'a', load);
  await cache.get('o1', 'b', load);
  await cache.get('o2', 'a', load);
  cache.invalidate('o1', 'a');
  t.equal(await cache.get('o1', 'a', load), 4);
  t.equal(await cache.get('o1', 'b', load), 2);
  cache.invalidate('o1');
  t.equal(await cache.get('o1', 'b', load), 5);
  t.equal(await cache.get('o2', 'a', load), 3);
  cache.invalidate();
  t.equal(cache.size, 0);
});

t.test('concurrent misses share one load; failures are not cached', async (t) => {
  let loads = 0;
  const cache = new PolicyCache<number>();
  const slow = () => new Promise<number>((r) => setTimeout(() => r(++loads), 10));
  const [a, b] = await Promise.all([cache.get('o', 'a', slow), cache.get('o', 'a', slow)]);
  t.equal(a, b);
  t.equal(loads, 1);
  await t.rejects(
    cache.get('o', 'x', () => Promise.reject(new Error('db down'))),
    /db down/,
  );
  t.equal(await cache.get('o', 'x', () => 7), 7);
});

t.test('an entry resolved from another source is a miss, so an old source never serves a new one', async (t) => {
  const cache = new PolicyCache<string>();
  const before = {};
  const after = {};
  t.equal(await cache.get('o', 'a', () => 'old', before), 'old');
  cache.invalidate();
  // A call that began before the reload resolves after it: its entry is tagged with its own source.
  t.equal(await cache.get('o', 'a', () => 'old', before), 'old');
  t.equal(await cache.get('o', 'a', () => 'new', after), 'new', 'a later call does not get the old policy');
  t.equal(await cache.get('o', 'a', () => 'unused', after), 'new', 'and then hits its own');
});
