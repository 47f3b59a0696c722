import t from 'tap';
import { conversationParts, MIN_PART_BYTES } from '../../pipeline/conversation-parts.ts';
import { partHash, ResentParts } from '../../pipeline/resent-parts.ts';
import { engine, metric, policyOf, same } from './part-cache-fixture.ts';

// Only what an agent resends is cached (docs/decisions.md): a body none of whose parts its agent sent
// before is scanned whole, as an engine without the cache scans it, and remembered unhashed; its parts
// are hashed and stored once the agent sends them again. Traffic that never resends pays no sha256, no
// look-up and no entry; a session pays one more scan of its first turn's parts, on its second turn.

const POLICY = policyOf({
  content_inspection: {
    pii_detection: { enabled: true },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: [{ pattern: 'project-[0-9]+', description: 'codename', severity: 'warn' }],
  },
});
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
const OTHER = { agentId: 'agent-2', orgId: 'org-1', agentName: 'reviewer' };

const message = (content: string) => ({ role: 'user', content: `${content} ${'lorem ipsum '.repeat(30)}` });
const body = (...contents: string[]) =>
  Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', system: 'be safe', messages: contents.map(message) }));

const LOOKUPS = ['dvx_inspection_cache_hits_total', 'dvx_inspection_cache_misses_total'];

t.test('fresh traffic: every body scanned whole, nothing looked up or stored, the same outcome', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  for (let i = 0; i < 20; i++) {
    // A counter at the head of every message: no body leads with a part of an earlier one.
    const b = body(`${i} mail bob@example.com`, `${i} key AKIAIOSFODNN7EXAMPLE`, `${i} project-${i}`);
    for (const identity of [AGENT, OTHER]) {
      const request = { body: b, phase: 'request' as const, policy: POLICY, identity };
      const got = await e.inspect(request);
      t.equal(got.decision, 'block');
      if (!same(t, got, await plain.e.inspect(request), `body ${i}`)) return;
    }
  }
  for (const name of LOOKUPS) t.equal(await metric(registry, name), 0, `${name}: none`);
  t.equal(await metric(registry, 'dvx_inspection_cache_skeleton_hits_total'), 0);
});

t.test('a session: the first turn whole, the second stores what it resends, the third finds it', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const turns = [
    body('key AKIAIOSFODNN7EXAMPLE', 'mail bob@example.com'),
    body('key AKIAIOSFODNN7EXAMPLE', 'mail bob@example.com', 'project-7 next'),
    body('key AKIAIOSFODNN7EXAMPLE', 'mail bob@example.com', 'project-7 next', 'then done'),
  ];
  const counts: number[][] = [];
  for (const [k, b] of turns.entries()) {
    const request = { body: b, phase: 'request' as const, policy: POLICY, identity: AGENT };
    const got = await e.inspect(request);
    t.equal(got.decision, 'block', `turn ${k + 1}: the key blocks`);
    if (!same(t, got, await plain.e.inspect(request), `turn ${k + 1}`)) return;
    counts.push(await Promise.all(LOOKUPS.map((name) => metric(registry, name))));
  }
  t.same(counts[0], [0, 0], 'turn 1: first sight, scanned whole');
  t.same(counts[1], [0, 3], 'turn 2: its three parts scanned and stored (two of them resent)');
  t.same(counts[2], [3, 4], 'turn 3: the three found, the new one scanned');
});

t.test('another agent`s body is first sight for this one, whatever the cache holds', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const b = body('shared system of tools', 'mail bob@example.com');
  for (let i = 0; i < 2; i++) await e.inspect({ body: b, phase: 'request', policy: POLICY, identity: AGENT });
  const misses = await metric(registry, 'dvx_inspection_cache_misses_total');
  t.equal(misses, 2, 'the agent stored both parts on its resend');
  const got = await e.inspect({ body: b, phase: 'request', policy: POLICY, identity: OTHER });
  t.equal(got.findings.length, 1, 'the other agent`s whole scan finds the mail');
  t.equal(await metric(registry, 'dvx_inspection_cache_hits_total'), 0, 'not looked up');
});

t.test('a body remembered unhashed: recalled by its spans, hashed and replaced once resent', async (t) => {
  const resent = new ResentParts(1 << 20);
  const first = body('alpha', 'beta', 'gamma');
  t.ok(resent.seenFirst('h', first, conversationParts(first)!), 'seen first');
  t.equal(resent.bytes, first.length + 64, 'its bytes are counted, and its first part`s sha256');

  const edited = body('alpha', 'beta', 'GAMMA', 'delta');
  const recall = resent.recall('h', edited)!;
  t.equal(recall.verified, 2, 'alpha and beta lead it with the same bytes; gamma changed');
  const parts = conversationParts(edited, MIN_PART_BYTES, recall.known)!;
  t.same(parts, conversationParts(edited), 'stepping over them walks as a whole walk does');
  t.equal(resent.recall('h', body('ALPHA', 'beta')), null, 'a changed first part: none verified');

  // Hashing the resent body remembers it hashed and forgets the unhashed one: its bytes counted once.
  const { hashes, reused } = resent.hashes('h', edited, parts, recall);
  t.equal(reused, 0, 'no hash is known of a body remembered unhashed');
  t.same(
    hashes,
    parts.map((p) => partHash(edited.subarray(p.start, p.end))),
  );
  t.equal(resent.bytes, edited.length + 64, 'the unhashed body was replaced');
  const next = body('alpha', 'beta', 'GAMMA', 'delta', 'epsilon');
  const again = resent.recall('h', next)!;
  t.equal(again.verified, 4);
  t.equal(resent.hashes('h', next, conversationParts(next)!, again).reused, 4, 'its hashes are reused now');
});

t.test('seenFirst: what counts as resent though no leading part is', async (t) => {
  const resent = new ResentParts(1 << 20);
  const seen = (b: Buffer, holder = 'h') => resent.seenFirst(holder, b, conversationParts(b)!);
  t.ok(seen(body('alpha', 'beta')));
  const moved = Buffer.from(body('alpha', 'beta').toString().replace('be safe', 'be safe, it is Tuesday'));
  t.equal(resent.recall('h', moved), null, 'a longer system prompt: no leading part verified');
  t.notOk(seen(moved), 'but its parts are the same bytes at the same index: resent');
  t.notOk(seen(body('beta', 'gamma')), 'a window slid by one: its first part is the second of one remembered');
  t.ok(seen(body('alpha!', 'beta!')), 'a byte changed in each part: seen first');
  t.ok(seen(moved, 'other'), 'another holder remembers nothing');

  // Three sub-conversations begun in turn: the holder remembers two bodies, and the first part of more.
  const fresh = new ResentParts(1 << 20);
  for (const task of ['one task', 'two task', 'three task'])
    t.ok(fresh.seenFirst('h', body(task), conversationParts(body(task))!), `${task}: seen first`);
  const b = body('one task', 'one step');
  t.equal(fresh.recall('h', b), null, 'the first one`s body is no longer remembered');
  t.notOk(fresh.seenFirst('h', b, conversationParts(b)!), 'but its first part is known: resent');
});

t.test('three sub-conversations interleaved: their parts are cached from their second turn', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const conversations: string[][] = [[], [], []];
  for (let turn = 0; turn < 8; turn++)
    for (const [c, messages] of conversations.entries()) {
      messages.push(`conversation ${c} turn ${turn}${turn === 3 ? ' mail bob@example.com' : ''}`);
      const request = { body: body(...messages), phase: 'request' as const, policy: POLICY, identity: AGENT };
      if (!same(t, await e.inspect(request), await plain.e.inspect(request), `${c}, turn ${turn}`)) return;
    }
  const hits = await metric(registry, 'dvx_inspection_cache_hits_total');
  t.ok(hits >= 3 * (1 + 2 + 3 + 4 + 5 + 6), `resent parts came from the cache (${hits} hits)`);
});

t.test('a small head shared from a body seen first holds memory of its own, not a pool slab', async (t) => {
  const resent = new ResentParts(1 << 20);
  const first = Buffer.from(
    JSON.stringify({ model: 'm', messages: [message('task'), { role: 'user', content: 'x'.repeat(20_000) }] }),
  );
  t.ok(resent.seenFirst('h', first, conversationParts(first)!));
  const next = Buffer.from(JSON.stringify({ model: 'm', messages: [message('task'), message('retry')] }));
  const recall = resent.recall('h', next)!;
  t.equal(recall.verified, 1);
  resent.hashes('h', next, conversationParts(next, MIN_PART_BYTES, recall.known)!, recall);
  t.ok(
    resent.retainedBytes <= 2 * resent.bytes,
    `held ${resent.retainedBytes} bytes for ${resent.bytes} counted (a pool slab is 64 KiB)`,
  );
  t.equal(resent.spareBytes, first.length, 'its head copied, not shared: the body seen first gave its copy back');
});

t.test('a system prompt that changes every turn: the parts are still cached from the second turn', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const messages: string[] = [];
  for (let turn = 0; turn < 6; turn++) {
    messages.push(turn === 2 ? 'key AKIAIOSFODNN7EXAMPLE' : `step ${turn}`);
    const b = Buffer.from(
      JSON.stringify({ model: 'm', system: `turn ${turn} at ${Date.now()}`, messages: messages.map(message) }),
    );
    const request = { body: b, phase: 'request' as const, policy: POLICY, identity: AGENT };
    if (!same(t, await e.inspect(request), await plain.e.inspect(request), `turn ${turn}`)) return;
  }
  t.ok((await metric(registry, 'dvx_inspection_cache_hits_total')) >= 6, 'resent parts were found');
});

t.test('a window sliding over the conversation: the parts are still cached', async (t) => {
  const { e, registry } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  for (let turn = 0; turn < 30; turn++) {
    const window = Array.from(
      { length: 8 },
      (_, i) => `message ${turn + i}${turn + i === 12 ? ' AKIAIOSFODNN7EXAMPLE' : ''}`,
    );
    const request = { body: body(...window), phase: 'request' as const, policy: POLICY, identity: AGENT };
    if (!same(t, await e.inspect(request), await plain.e.inspect(request), `turn ${turn}`)) return;
  }
  const hits = await metric(registry, 'dvx_inspection_cache_hits_total');
  t.ok(hits >= 28 * 6, `most parts came from the cache (${hits} hits)`);
});

t.test('a body over the cap is not remembered', async (t) => {
  const resent = new ResentParts(100);
  const b = body('alpha');
  t.ok(resent.seenFirst('h', b, conversationParts(b)!), 'seen first: scanned whole');
  t.equal(resent.bytes, 0);
  t.equal(resent.recall('h', b), null);

  // Two bodies over the cap together: the holder goes whole, its first parts with it, counted exactly.
  const one = body('one');
  const two = body('two');
  const small = new ResentParts(Math.ceil(1.5 * one.length));
  t.ok(small.seenFirst('h', one, conversationParts(one)!));
  t.equal(small.bytes, one.length + 64);
  t.ok(small.seenFirst('h', two, conversationParts(two)!));
  t.equal(small.bytes, 0, 'the holder was dropped, bodies and first parts');
  t.ok(small.seenFirst('h', one, conversationParts(one)!), 'its first parts went with it');
  t.equal(small.bytes, one.length + 64);
});

t.test(
  'a dropped body seen first gives its copy back; a body written into it is recalled by its own bytes',
  async (t) => {
    const resent = new ResentParts(1 << 22);
    const seen = (holder: string, b: Buffer) => resent.seenFirst(holder, b, conversationParts(b)!);
    // Bodies of one size, each part differing early (a counter) or late (a last word), as fresh traffic does.
    const a = [0, 1, 2].map((i) => body(`a${i} alpha`, `a beta ${i}`, `a gamma ${i}`));
    for (const b of a) t.ok(seen('a', b), 'a body of agent a: seen first');
    const held = () => resent.retainedBytes + resent.spareBytes;
    t.equal(resent.spareBytes, a[0].length, 'the first one dropped: its copy kept spare');
    t.equal(resent.retainedBytes, resent.bytes - 3 * 64, 'the two remembered hold their own bytes');
    const before = held();
    const b0 = body('b0 alpha', 'b beta 0', 'b gamma 0');
    t.equal(b0.length, a[0].length);
    t.ok(seen('b', b0), 'a body of agent b: seen first');
    t.equal(held(), before, 'written into the spare copy, not a new one');
    t.equal(resent.spareBytes, 0);

    // Each holder's bodies are still its own bytes: a's last body and b's are recalled part for part,
    // and one byte changed anywhere in a part stops the recall there.
    const next = (parts: string[]) => body(...parts);
    const aNext = next(['a2 alpha', 'a beta 2', 'a gamma 2', 'a delta']);
    t.equal(resent.recall('a', aNext)?.verified, 3, 'agent a`s last body, part for part');
    const bNext = next(['b0 alpha', 'b beta 0', 'b gamma 0', 'b delta']);
    t.equal(resent.recall('b', bNext)?.verified, 3, 'agent b`s body, in the given-back copy');
    t.equal(resent.recall('b', next(['b0 alpha', 'b beta 0', 'b gamma 9', 'b delta']))?.verified, 2, 'a late byte');
    t.equal(resent.recall('b', next(['b0 alpha', 'b beta 0', 'B gamma 0']))?.verified, 2, 'an early byte');
    t.equal(resent.recall('a', bNext), null, 'agent a never sent b`s bytes');

    // Resent, b's body shares its copy with the body that resends it: that copy is not given back when
    // the unhashed body is replaced, so the next body seen first gets memory of its own.
    const recall = resent.recall('b', bNext)!;
    resent.hashes('b', bNext, conversationParts(bNext, MIN_PART_BYTES, recall.known)!, recall);
    t.equal(resent.spareBytes, 0, 'b`s copy, shared, was not given back');
    const then = held();
    const c0 = body('c0 alpha', 'c beta 0', 'c gamma 0');
    t.ok(seen('c', c0));
    t.equal(held(), then + c0.length, 'so the next body seen first gets a new copy');
    const again = resent.recall('b', next(['b0 alpha', 'b beta 0', 'b gamma 0', 'b delta', 'b epsilon']));
    t.equal(again?.verified, 4, 'and b`s remembered bytes are intact');
  },
);

t.test('fresh traffic from several agents, bodies given back and written again: what no cache finds', async (t) => {
  const { e } = engine(t, { threads: 0 });
  const plain = engine(t, { threads: 0, cacheBytes: 0 });
  const agents = [AGENT, OTHER, { agentId: 'agent-3', orgId: 'org-1', agentName: 'tester' }];
  const leaks = ['mail bob@example.com', 'key AKIAIOSFODNN7EXAMPLE', 'project-12', 'nothing'];
  let sessionTurns: string[] = [];
  for (let i = 0; i < 120; i++) {
    const identity = agents[i % 3];
    // Mostly fresh bodies of about one size (their copies given back and reused), now and then a
    // session's next turn (the last fresh body resent with one more message).
    const fresh = i % 7 !== 6;
    sessionTurns = fresh
      ? [`${i} ${leaks[i % 4]}`, `${i} second`, `${i} third ${leaks[(i + 1) % 4]}`]
      : [...sessionTurns, `${i} more ${leaks[(i + 2) % 4]}`];
    const request = { body: body(...sessionTurns), phase: 'request' as const, policy: POLICY, identity };
    if (!same(t, await e.inspect(request), await plain.e.inspect(request), `call ${i}`)) return;
  }
});
