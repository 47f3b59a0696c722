import fc from 'fast-check';
import t from 'tap';
import { conversationParts, MIN_PART_BYTES, skeleton } from '../../pipeline/conversation-parts.ts';
import { PartCache } from '../../pipeline/part-cache.ts';
import { partHash, ResentParts } from '../../pipeline/resent-parts.ts';
import { engine, policyOf, same } from './part-cache-fixture.ts';

// A skeleton byte for byte the recalled body's reuses that body's sha256 instead of hashing it again
// (resent-parts.ts, skeletonHash): the system prompt, in the skeleton, is often its largest part. The
// key must still be the sha256 of the skeleton's own bytes whatever the agent sends: a skeleton changed
// in place (same length, one word) must be scanned, as an engine without the cache scans it.

const POLICY = policyOf({
  content_inspection: {
    secrets_filter: { enabled: true },
    pii_detection: { enabled: true },
    patterns: [{ pattern: 'project-[0-9]+', description: 'codename', severity: 'block' }],
  },
});
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
// Systems of one length, a clean one and ones holding a finding in the same place; and tails of one
// length likewise, after `messages`: a tail changed with every part still recalled is where the
// skeleton's bytes are compared rather than hashed (a changed system prompt fails the recall first).
const SYSTEMS = [
  `you are helpful; write to nobody at ${'x'.repeat(40)} thanks ${'s'.repeat(600)}`,
  `you are helpful; write to bob@example.com ${'x'.repeat(22)} thanks ${'s'.repeat(600)}`,
  `you are helpful; write to nobody at project-1234567 ${'x'.repeat(25)} thanks ${'s'.repeat(600)}`,
];
const TAILS = ['nobody at nowhere.', 'bob@example.com ok', 'see project-123456'];
const message = (k: number) => ({ role: k % 2 ? 'assistant' : 'user', content: `turn ${k} ${'lorem '.repeat(60)}` });
const body = (system: string, turns: number, tail: string) =>
  Buffer.from(
    JSON.stringify({
      model: 'm',
      system,
      messages: Array.from({ length: turns }, (_, k) => message(k)),
      metadata: { note: tail },
    }),
  );
const step = fc.tuple(fc.nat({ max: SYSTEMS.length - 1 }), fc.nat({ max: TAILS.length - 1 }), fc.boolean());

t.test('property: a skeleton changed in place is found as an engine without the cache finds it', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.array(step, { minLength: 2, maxLength: 10 }), async (script) => {
      const cached = engine(t, { threads: 0, cacheBytes: 1 << 20 }).e;
      const whole = engine(t, { threads: 0, cacheBytes: 0 }).e;
      let turns = 0;
      for (let k = 0; k < script.length; k++) {
        const [system, tail, grows] = script[k];
        // The conversation grows by a message, or is resent as it was with only its tail changed.
        if (grows || turns === 0) turns++;
        const b = body(SYSTEMS[system], turns, TAILS[tail]);
        const request = { body: b, phase: 'request' as const, policy: POLICY, secrets: [], identity: AGENT };
        if (!same(t, await cached.inspect(request), await whole.inspect(request), `turn ${k}`)) return false;
      }
      await cached.close();
      await whole.close();
      return true;
    }),
    { numRuns: 80 },
  );
});

t.test('property: the skeleton key is the sha256 of its bytes, and its bytes are counted', async (t) => {
  fc.assert(
    fc.property(fc.array(step, { minLength: 1, maxLength: 12 }), (script) => {
      const cap = 64 * 1024;
      const resent = new ResentParts(cap, new PartCache({ maxBytes: cap }));
      let turns = 0;
      for (const [system, tail, grows] of script) {
        if (grows || turns === 0) turns++;
        const b = body(SYSTEMS[system], turns, TAILS[tail]);
        const recall = resent.recall('h', b);
        const parts = conversationParts(b, MIN_PART_BYTES, recall?.known);
        if (parts === null) return false;
        const { remembered } = resent.hashes('h', b, parts, recall, 'ctx');
        const skel = skeleton(b, parts);
        if (resent.skeletonHash(recall, remembered, skel) !== partHash(skel)) return false;
        if (resent.bytes > cap || resent.retainedBytes > 1.1 * resent.bytes) return false;
      }
      return true;
    }),
    { numRuns: 300 },
  );
  // The last two bodies are remembered, each counting its skeleton.
  const resent = new ResentParts(1 << 20);
  let counted = 0;
  for (let k = 0; k < 3; k++) {
    const b = body(SYSTEMS[0], k + 1, TAILS[0]);
    const recall = resent.recall('h', b);
    const parts = conversationParts(b, MIN_PART_BYTES, recall?.known)!;
    const { remembered } = resent.hashes('h', b, parts, recall, 'ctx');
    const skel = skeleton(b, parts);
    resent.skeletonHash(recall, remembered, skel);
    if (k > 0) counted += b.length + skel.length;
  }
  t.equal(resent.bytes, counted, 'the last two bodies and their skeletons');
});
