// Not a test: a fresh process's first sessions, as the `session` bench sees them.
import { parseArgs } from 'node:util';
import { resolve } from 'node:path';
import { cpuMs, sessionPolicy, sessionSecrets } from './session-measure.ts';
import { sessionBodies } from '../../bench/session.ts';

const { values } = parseArgs({
  options: {
    against: { type: 'string' },
    threads: { type: 'string', default: '1' },
    sessions: { type: 'string', default: '3' },
    warm: { type: 'string', default: '8' },
    off: { type: 'boolean', default: false },
  },
});
const dir = values.against ?? resolve(import.meta.dirname, '../..');
const { InspectionEngine } = await import(resolve(dir, 'pipeline/engine.ts'));
const policy = sessionPolicy;
const secrets = sessionSecrets;
const engine = new InspectionEngine({ threads: Number(values.threads), cacheBytes: values.off ? 0 : 64 * 1024 * 1024 });
const identity = { orgId: 'o', agentId: 'agent', agentName: 'a' };
const cpu = cpuMs;
const warm = sessionBodies(Number(values.warm), 1);
for (const b of warm) await engine.inspect({ body: Buffer.from(b), phase: 'request', policy, secrets, identity });
const out: string[] = [];
for (let s = 0; s < Number(values.sessions); s++) {
  const bodies = sessionBodies(40, 100 + s);
  let wall = 0;
  let c = 0;
  for (const b of bodies) {
    const body = Buffer.from(b);
    const c0 = cpu();
    const o = await engine.inspect({ body, phase: 'request', policy, secrets, identity });
    c += cpu() - c0;
    wall += o.durationMs;
  }
  out.push(`s${s}: wall ${wall.toFixed(1)} cpu ${c.toFixed(1)}`);
}
console.log(out.join(' | '));
await engine.close();
