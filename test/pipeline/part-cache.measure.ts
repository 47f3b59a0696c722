// Not a test: CPU of InspectionEngine.inspect over whole generated sessions (bench/session.ts's
// generator), with the per-part cache off and on, inline, several runs, medians. Used for
// docs/decisions.md ("A cached turn's fixed costs"). Run: node test/pipeline/part-cache.measure.ts
// [--runs N] [--sessions N] [--turns N] [--format anthropic|openai] [--prefix] [--fresh]
// [--against DIR] [--short] [--system KB] [--trash MB].
// --short adds a short user message ("continue") after each tool result, so every turn ends with one;
// --system gives the system prompt KB kilobytes. --fresh copies each body just before it is inspected
// (untimed), as the proxy hands the engine a body it has just assembled from the socket's chunks (in
// the CPU's cache) rather than one generated long before. --trash MB writes over MB megabytes of other
// memory before each call (untimed), as a proxy's own work between calls evicts the scan's tables and
// code from the CPU's caches (16: the cached path then costs about a third more here). --against DIR
// runs DIR's engine (another checkout, e.g. `git archive` of the base commit) with its cache off and
// on, interleaved with this one's, for an A/B in one process.
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { cpuMs, sessionPolicy, sessionSecrets } from './session-measure.ts';
import { sessionBodies, type SessionFormat } from '../../bench/session.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';

const { values } = parseArgs({
  options: {
    runs: { type: 'string', default: '7' },
    sessions: { type: 'string', default: '3' },
    turns: { type: 'string', default: '40' },
    format: { type: 'string', default: 'anthropic' },
    prefix: { type: 'boolean', default: false },
    only: { type: 'string' },
    fresh: { type: 'boolean', default: false },
    trash: { type: 'string', default: '0' },
    short: { type: 'boolean', default: false },
    system: { type: 'string', default: '0' },
    against: { type: 'string' },
  },
});
const runs = Number(values.runs);
const turns = Number(values.turns);
const sessionsN = Number(values.sessions);

const trash = Number(values.trash) > 0 ? new Uint8Array(Number(values.trash) * 1024 * 1024) : null;
const policy = sessionPolicy;
const secrets = sessionSecrets;

// A security-context prefix in `system`, as llmproxy adds (~1 KB), when --prefix; a long system
// prompt (--system); a short message after each tool result (--short).
const systemKb = Number(values.system);
// Prose and code as the sessions' tool results have them (another seed's), not one repeated sentence.
const SYSTEM_TEXT = JSON.stringify(JSON.parse(sessionBodies(8, 7)[7].toString()).messages).slice(0, systemKb * 1024);
function withPrefix(body: Buffer): Buffer {
  if (!values.prefix && !values.short && systemKb === 0) return body;
  const o = JSON.parse(body.toString()) as { system?: string; messages: { role: string; content: unknown }[] };
  if (systemKb > 0) o.system = `${o.system ?? ''}\n${SYSTEM_TEXT}`;
  if (values.prefix) o.system = `${'[dvx security context] '.repeat(48)}\n${o.system ?? ''}`;
  if (values.short)
    o.messages = o.messages.flatMap((m, i) =>
      i > 0 && m.role !== 'assistant' ? [m, { role: 'user', content: 'continue' }] : [m],
    );
  return Buffer.from(JSON.stringify(o));
}

const sessions = Array.from({ length: sessionsN }, (_, s) =>
  sessionBodies(turns, 100 + s, values.format as SessionFormat).map(withPrefix),
);

type Engine = Pick<InspectionEngine, 'inspect' | 'close'>;
const Base: (new (options: { threads: number; cacheBytes: number }) => Engine) | null = values.against
  ? (await import(resolve(values.against, 'pipeline/engine.ts'))).InspectionEngine
  : null;

async function session(
  engine: Engine,
  bodies: Buffer[],
  s: number,
  perTurn: number[],
  perCall: number[],
): Promise<number> {
  let total = 0;
  for (let t = 0; t < bodies.length; t++) {
    const body = values.fresh ? Buffer.from(bodies[t]) : bodies[t];
    if (trash !== null) for (let i = 0; i < trash.length; i += 64) trash[i]++;
    const before = cpuMs();
    await engine.inspect({
      body,
      phase: 'request',
      policy,
      secrets,
      identity: { orgId: 'o', agentId: `agent-${s}`, agentName: 'a' },
    });
    const d = cpuMs() - before;
    total += d;
    perTurn[t] += d;
    perCall.push(d);
  }
  return total;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const modes = values.only ? [values.only] : Base ? ['off', 'on', 'base-off', 'base-on'] : ['off', 'on'];
const results: Record<string, number[]> = Object.fromEntries(modes.map((m) => [m, []]));
const lastTen: Record<string, number[]> = Object.fromEntries(modes.map((m) => [m, []]));
/** Per run, each call's CPU (sessions × turns): a call's median over the runs drops a GC that fell in it. */
const calls: Record<string, number[][]> = Object.fromEntries(modes.map((m) => [m, []]));
for (let r = 0; r < runs + 1; r++) {
  for (const mode of modes) {
    const options = { threads: 0, cacheBytes: mode.endsWith('off') ? 0 : 64 * 1024 * 1024 };
    const engine: Engine = mode.startsWith('base-') ? new Base!(options) : new InspectionEngine(options);
    // The policy's plan is compiled once per engine (RE2 patterns): not a cost of the session.
    await engine.inspect({ body: Buffer.from('{"model":"claude-x"}'), phase: 'request', policy, secrets });
    const perTurn = new Array(turns).fill(0);
    const perCall: number[] = [];
    let total = 0;
    for (let s = 0; s < sessions.length; s++) total += await session(engine, sessions[s], s, perTurn, perCall);
    await engine.close();
    if (r === 0) continue; // warm-up
    results[mode].push(total / sessions.length);
    calls[mode].push(perCall);
    lastTen[mode].push(perTurn.slice(-10).reduce((a, b) => a + b, 0) / 10 / sessions.length);
  }
}
const bytes = sessions[0].reduce((n, b) => n + b.length, 0);
console.log(
  `${sessionsN} sessions × ${turns} turns (${values.format}${values.prefix ? ', prefix' : ''}${values.short ? ', short messages' : ''}${systemKb ? `, ${systemKb} KB system prompt` : ''}${values.fresh ? ', fresh bodies' : ''}), last body ${(sessions[0].at(-1)!.length / 1024).toFixed(0)} KB, ${(bytes / 1024 / 1024).toFixed(2)} MB per session; ${runs} runs`,
);
/** Sum over the calls of each call's median (or least) over the runs, per session. */
const byCall = (mode: string, of = median) =>
  calls[mode][0].reduce((sum, _, i) => sum + of(calls[mode].map((run) => run[i])), 0) / sessions.length;
const least = (xs: number[]) => Math.min(...xs);
for (const mode of modes) {
  const xs = results[mode];
  console.log(
    `cache ${mode}: median ${median(xs).toFixed(1)} ms/session (min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)}); sum of per-call medians ${byCall(mode).toFixed(1)} ms/session (of minima ${byCall(mode, least).toFixed(1)}); last ten turns ${median(lastTen[mode]).toFixed(3)} ms/turn`,
  );
}
for (const mode of modes.filter((m) => m.endsWith('on'))) {
  // Each engine's cache on against the same engine's cache off (base-on against base-off).
  const off = mode.startsWith('base-') ? 'base-off' : 'off';
  if (!results[off]) continue;
  console.log(
    `ratio ${off}/${mode}: ${(median(results[off]) / median(results[mode])).toFixed(2)}× (per-call medians ${(byCall(off) / byCall(mode)).toFixed(2)}×, minima ${(byCall(off, least) / byCall(mode, least)).toFixed(2)}×)`,
  );
}
