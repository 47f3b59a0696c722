// Not a test: the cached path's stages timed one by one over the `session` bench's generated sessions
// (in process, warm, hot bodies), as the engine runs them for a turn whose skeleton is a hit: the
// recall, the walk, the keys, the skeleton, the new parts' scan. Medians over runs, per session.
// Run: node test/pipeline/part-cache.stages.ts [--runs N] [--fresh]
import { parseArgs } from 'node:util';
import { sessionPolicy, sessionSecrets } from './session-measure.ts';
import { sessionBodies } from '../../bench/session.ts';
import { conversationParts, group, skeleton, MIN_PART_BYTES } from '../../pipeline/conversation-parts.ts';
import { PartCache } from '../../pipeline/part-cache.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { partHash, ResentParts } from '../../pipeline/resent-parts.ts';
import { scanBody } from '../../pipeline/scan.ts';

const { values } = parseArgs({
  options: { runs: { type: 'string', default: '15' }, fresh: { type: 'boolean', default: false } },
});
const policy = sessionPolicy;
const secrets = sessionSecrets;
const plan = compilePlan(policy);
const sessions = Array.from({ length: 3 }, (_, s) => sessionBodies(40, 100 + s));
const stages = ['recall', 'walk', 'hashes', 'skeleton', 'group', 'scan new', 'scan whole'] as const;
const times: Record<string, number[]> = Object.fromEntries(stages.map((s) => [s, []]));
for (let r = 0; r <= Number(values.runs); r++) {
  const t: Record<string, number> = Object.fromEntries(stages.map((s) => [s, 0]));
  const cache = new PartCache({ maxBytes: 32 << 20 });
  const resent = new ResentParts(32 << 20, cache);
  for (let s = 0; s < sessions.length; s++) {
    for (const sent of sessions[s]) {
      // --fresh: a copy made just before (untimed), in the CPU's cache as the proxy's assembled body is.
      const body = values.fresh ? Buffer.from(sent) : sent;
      let t0 = performance.now();
      const recall = resent.recall(`a${s}`, body);
      let t1 = performance.now();
      t.recall += t1 - t0;
      const parts = conversationParts(body, MIN_PART_BYTES, recall?.known)!;
      t0 = performance.now();
      t.walk += t0 - t1;
      const { hashes, found } = resent.hashes(`a${s}`, body, parts, recall, 'ctx');
      t1 = performance.now();
      t.hashes += t1 - t0;
      partHash(skeleton(body, parts));
      t0 = performance.now();
      t.skeleton += t0 - t1;
      const fresh = parts.filter((_, k) => found[k] === undefined);
      const g = fresh.length > 0 ? group(body, fresh) : null;
      t1 = performance.now();
      t.group += t1 - t0;
      if (g) scanBody(plan, { body: g, phase: 'request', secrets, skipModel: true });
      t0 = performance.now();
      t['scan new'] += t0 - t1;
      for (let k = 0; k < parts.length; k++)
        found[k] ??= cache.get(`ctx${hashes[k]}`) ?? cache.set(`ctx${hashes[k]}`, []);
      if (s === 0) {
        scanBody(plan, { body, phase: 'request', secrets });
        t['scan whole'] += performance.now() - t0;
      }
    }
  }
  if (r > 0) for (const s of stages) times[s].push(t[s] / (s === 'scan whole' ? 1 : sessions.length));
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
console.log(
  stages.map((s) => `${s} ${median(times[s]).toFixed(3)} (min ${Math.min(...times[s]).toFixed(3)})`).join(' | '),
  'ms/session',
);
