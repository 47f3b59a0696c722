import t, { type Test } from 'tap';
import { createRegistry } from '../../core/metrics.ts';
import { conversationParts, MIN_PART_BYTES } from '../../pipeline/conversation-parts.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { PartCache } from '../../pipeline/part-cache.ts';
import { ResentParts } from '../../pipeline/resent-parts.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// A resent part whose findings an agent's next body inherits (resent-parts.ts) is not looked up in
// the cache, so it used not to move in the LRU: under a full cache the parts of the agent that was
// busiest were the first evicted, and were scanned again once its remembered body was gone. Now an
// inherited part is touched as a hit would be, and stored again if it was evicted meanwhile.

const POLICY = policyFromDocument(validatePolicyDocument({ content_inspection: { pii_detection: { enabled: true } } }));
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
/** A caller that no body is remembered for (no agent id): each of its parts is looked up. */
const STRANGER = { agentId: '', orgId: 'org-1', agentName: '' };
/** What one entry without findings costs in the cap (part-cache.ts: overhead + a key of 88 characters). */
const ENTRY = 112 + 2 * 88;

const message = (name: string) => ({ role: 'user', content: `${name} ${'x'.repeat(250)}` });
const body = (...names: string[]) => Buffer.from(JSON.stringify({ model: 'm', messages: names.map(message) }));

async function counter(registry: ReturnType<typeof createRegistry>, name: string): Promise<number> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  return (m?.values ?? []).reduce((sum, v) => sum + v.value, 0);
}

/** An engine whose cache holds `entries` entries (half of the cap is theirs, the other half the remembered bodies'). */
function engine(t: Test, entries: number) {
  const registry = createRegistry();
  const e = new InspectionEngine({ threads: 0, cacheBytes: 2 * entries * ENTRY, registry, adaptiveOffload: null });
  t.teardown(() => e.close());
  const inspect = async (b: Buffer, identity = AGENT) => {
    const misses = await counter(registry, 'dvx_inspection_cache_misses_total');
    await e.inspect({ body: b, phase: 'request', policy: POLICY, identity });
    return (await counter(registry, 'dvx_inspection_cache_misses_total')) - misses;
  };
  return inspect;
}

t.test('an inherited part moves to the back of the LRU, as a hit would', async (t) => {
  const inspect = engine(t, 6);
  t.equal(await inspect(body('a1', 'a2')), 0, 'the agent`s first body: scanned whole, nothing cached');
  t.equal(await inspect(body('a1', 'a2')), 2, 'the agent resends it: two new parts (then its skeleton)');
  t.equal(await inspect(body('f1'), STRANGER), 1, 'a stranger: one part, one skeleton (5 entries)');
  t.equal(await inspect(body('a1', 'a2', 'a3')), 1, 'the agent again: a1 and a2 inherited, a3 new (6 entries)');
  t.equal(await inspect(body('f2'), STRANGER), 1, 'a stranger: one more part evicts the oldest entry');
  // Nothing remembered for a stranger: each part of the agent's body is a cache look-up.
  t.equal(await inspect(body('a1', 'a2', 'a3'), STRANGER), 0, 'the agent`s parts are all still cached');
});

t.test('an inherited part that was evicted is stored again', async (t) => {
  const inspect = engine(t, 4);
  t.equal(await inspect(body('a1', 'a2')), 0, 'first sight: scanned whole');
  t.equal(await inspect(body('a1', 'a2')), 2);
  for (const f of ['f1', 'f2', 'f3']) await inspect(body(f), STRANGER);
  t.equal(await inspect(body('a1', 'a2', 'a3')), 1, 'a1 and a2 inherited from the remembered body, a3 new');
  t.equal(await inspect(body('a1', 'a2'), STRANGER), 0, 'a1 and a2 are in the cache again');
});

t.test('touch: a live entry moves to the back; an evicted or unknown one says so', async (t) => {
  const cache = new PartCache({ maxBytes: 2 * (ENTRY + 2) });
  const a = cache.set(`${'k'.repeat(87)}a`, [])!;
  const b = cache.set(`${'k'.repeat(87)}b`, [])!;
  t.ok(cache.touch(a), 'a is held');
  cache.set(`${'k'.repeat(87)}c`, []);
  t.ok(cache.touch(a), 'a was touched after b, so b was evicted, not a');
  t.notOk(cache.touch(b), 'b is gone');
  t.notOk(cache.touch([]), 'an array no entry returned');
});

t.test('two agents inheriting the same part keep one entry, never replacing each other`s', async (t) => {
  const cache = new PartCache({ maxBytes: 1 << 20 });
  const resent = new ResentParts(1 << 20, cache);
  const context = cache.context('request', 'v1', [], ['secrets']);
  const shared = JSON.stringify({ role: 'user', content: 's'.repeat(300) });
  const turn = (...more: string[]) => Buffer.from(`{"model":"m","messages":[${[shared, ...more].join(',')}]}`);
  /** One inspection as the engine does it: parts known from the agent's last body, else looked up, else stored. */
  const inspect = (holder: string, body: Buffer) => {
    const recall = resent.recall(holder, body);
    const parts = conversationParts(body, MIN_PART_BYTES, recall?.known)!;
    const { hashes, found } = resent.hashes(holder, body, parts, recall, context);
    for (let k = 0; k < parts.length; k++)
      found[k] ??= cache.get(context + hashes[k]) ?? cache.set(context + hashes[k], []);
    return found;
  };
  const a = inspect('a', turn());
  inspect('b', turn());
  // The shared part's entry is replaced (another agent's scan stored the same key meanwhile).
  const replaced = cache.set(cache.key(context, Buffer.from(shared)), [])!;
  t.notOk(cache.touch(a[0]!), 'the entry agent a learnt is gone');
  const a2 = inspect('a', turn(JSON.stringify({ role: 'user', content: 'a'.repeat(300) })));
  t.equal(a2[0], replaced, 'agent a inherits the entry now held, by its key');
  const b2 = inspect('b', turn(JSON.stringify({ role: 'user', content: 'b'.repeat(300) })));
  t.equal(b2[0], replaced, 'so does agent b');
  t.ok(cache.touch(replaced), 'the entry was not replaced again');
});
