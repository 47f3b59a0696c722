// Not a test: CPU of InspectionEngine.inspect over whole generated sessions (bench/session.ts's
// generator), with the per-part cache off and on, inline, several runs, medians. Used for
// docs/decisions.md ("A cached turn's fixed costs"). Run: node test/pipeline/part-cache.measure.ts
// [--runs N] [--sessions N] [--turns N] [--format anthropic|openai] [--prefix]
import { parseArgs } from 'node:util';
import { BENCH_PATTERNS, BENCH_SECRETS } from '../../bench/corpus.ts';
import { sessionBodies, type SessionFormat } from '../../bench/session.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

const { values } = parseArgs({
  options: {
    runs: { type: 'string', default: '7' },
    sessions: { type: 'string', default: '3' },
    turns: { type: 'string', default: '40' },
    format: { type: 'string', default: 'anthropic' },
    prefix: { type: 'boolean', default: false },
    only: { type: 'string' },
  },
});
const runs = Number(values.runs);
const turns = Number(values.turns);
const sessionsN = Number(values.sessions);

const policy = policyFromDocument(
  validatePolicyDocument({
    model_policy: { mode: 'allowlist', models: ['claude-*', 'gpt-*'] },
    content_inspection: {
      secrets_filter: { enabled: true, severity: 'block' },
      pii_detection: { enabled: true, severity: 'warn' },
      api_key_detection: { enabled: true, severity: 'warn' },
      patterns: BENCH_PATTERNS.map((p) => ({ ...p, severity: p.severity === 'block' ? 'warn' : p.severity })),
    },
  }),
);
const secrets = Object.freeze([...BENCH_SECRETS]);

// A security-context prefix in `system`, as llmproxy adds (~1 KB), when --prefix.
function withPrefix(body: Buffer): Buffer {
  if (!values.prefix) return body;
  const o = JSON.parse(body.toString()) as { system?: string };
  o.system = `${'[dvx security context] '.repeat(48)}\n${o.system ?? ''}`;
  return Buffer.from(JSON.stringify(o));
}

const sessions = Array.from({ length: sessionsN }, (_, s) =>
  sessionBodies(turns, 100 + s, values.format as SessionFormat).map(withPrefix),
);

function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

async function session(engine: InspectionEngine, bodies: Buffer[], s: number, perTurn?: number[]): Promise<number> {
  let total = 0;
  for (let t = 0; t < bodies.length; t++) {
    const before = cpuMs();
    await engine.inspect({
      body: bodies[t],
      phase: 'request',
      policy,
      secrets,
      identity: { orgId: 'o', agentId: `agent-${s}`, agentName: 'a' },
    });
    const d = cpuMs() - before;
    total += d;
    if (perTurn) perTurn[t] += d;
  }
  return total;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const results: Record<string, number[]> = { off: [], on: [] };
const lastTen: Record<string, number[]> = { off: [], on: [] };
const modes = values.only ? [values.only] : ['off', 'on'];
for (let r = 0; r < runs + 1; r++) {
  for (const mode of modes) {
    const engine = new InspectionEngine({ threads: 0, cacheBytes: mode === 'on' ? 64 * 1024 * 1024 : 0 });
    // The policy's plan is compiled once per engine (RE2 patterns): not a cost of the session.
    await engine.inspect({ body: Buffer.from('{"model":"claude-x"}'), phase: 'request', policy, secrets });
    const perTurn = new Array(turns).fill(0);
    let total = 0;
    for (let s = 0; s < sessions.length; s++) total += await session(engine, sessions[s], s, perTurn);
    await engine.close();
    if (r === 0) continue; // warm-up
    results[mode].push(total / sessions.length);
    lastTen[mode].push(perTurn.slice(-10).reduce((a, b) => a + b, 0) / 10 / sessions.length);
  }
}
const bytes = sessions[0].reduce((n, b) => n + b.length, 0);
console.log(
  `${sessionsN} sessions × ${turns} turns (${values.format}${values.prefix ? ', prefix' : ''}), last body ${(sessions[0].at(-1)!.length / 1024).toFixed(0)} KB, ${(bytes / 1024 / 1024).toFixed(2)} MB per session; ${runs} runs`,
);
for (const mode of modes) {
  const xs = results[mode];
  console.log(
    `cache ${mode}: median ${median(xs).toFixed(1)} ms/session (min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)}); last ten turns ${median(lastTen[mode]).toFixed(3)} ms/turn`,
  );
}
if (modes.length === 2) console.log(`ratio off/on: ${(median(results.off) / median(results.on)).toFixed(2)}×`);
