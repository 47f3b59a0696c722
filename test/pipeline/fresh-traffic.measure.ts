// Not a test: main-thread CPU of InspectionEngine.inspect on fresh traffic (every body differs in every
// message, as the proxy bench sends), with the per-part cache at its default and off, inline.
// Run: node test/pipeline/fresh-traffic.measure.ts [--kb 4,64] [--calls N] [--runs N] [--against DIR]
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { freshBodies, llmRequestBody } from '../../bench/corpus.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { cpuMs, sessionPolicy, sessionSecrets } from './session-measure.ts';

const { values } = parseArgs({
  options: {
    kb: { type: 'string', default: '4,64' },
    calls: { type: 'string', default: '2000' },
    runs: { type: 'string', default: '5' },
    against: { type: 'string' },
  },
});
type Engine = Pick<InspectionEngine, 'inspect' | 'close'>;
type EngineClass = new (options: { threads: number; cacheBytes?: number }) => Engine;
const engines: [string, EngineClass][] = [['this', InspectionEngine as EngineClass]];
if (values.against)
  engines.push(['against', (await import(resolve(values.against, 'pipeline/engine.ts'))).InspectionEngine]);

const calls = Number(values.calls);
for (const kb of values.kb.split(',').map(Number)) {
  const next = freshBodies(llmRequestBody(kb * 1024));
  const rows: Record<string, number[]> = {};
  for (let r = 0; r < Number(values.runs); r++) {
    for (const [name, E] of engines) {
      for (const cache of [true, false]) {
        const engine = new E({ threads: 0, ...(cache ? {} : { cacheBytes: 0 }) });
        const bodies = Array.from({ length: Math.max(50, calls / (kb > 16 ? 8 : 1)) }, next);
        let cpu = 0;
        for (let i = 0; i < bodies.length; i++) {
          const before = cpuMs();
          await engine.inspect({
            body: bodies[i],
            phase: 'request',
            policy: sessionPolicy,
            secrets: sessionSecrets,
            identity: { orgId: 'o', agentId: `agent-${i % 4}`, agentName: 'a' },
          });
          if (i >= bodies.length / 5) cpu += cpuMs() - before;
        }
        await engine.close();
        const key = `${name} cache ${cache ? 'on' : 'off'}`;
        (rows[key] ??= []).push((cpu * 1000) / (bodies.length - Math.ceil(bodies.length / 5)));
      }
    }
  }
  for (const [k, v] of Object.entries(rows)) {
    v.sort((a, b) => a - b);
    console.log(`${kb} KB ${k}: median ${v[v.length >> 1].toFixed(1)} µs/call (min ${v[0].toFixed(1)})`);
  }
}
