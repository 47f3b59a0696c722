// Not a test: the CPU of one synchronous scan of a SMALL body (docs/decisions.md, "A small scan's
// fixed cost"): scanBody, and the engine's inline path (InspectionEngine.inspect, no pool, no cache),
// over a 300-byte Anthropic answer and a 300-byte chat answer (response phase), a 4 KB request body and
// a 300-byte one,
// under the pipeline bench's full set and three secrets. Batches of each case, interleaved, medians.
// With --against DIR (e.g. `git archive main pipeline core | tar -x -C .base`), DIR's pipeline runs
// interleaved with this tree's, in this process, for an A/B.
// With --cold, each scan runs alone after 8 MB of other memory was written (the CPU's caches then hold
// none of the scan's code and tables, as in a proxy between calls; the body is read back in first, as
// the proxy has just read it), timed by the wall clock, medians.
// Run: node test/pipeline/small-scan.measure.ts [--against .base] [--rounds N] [--batch N] [--cold] [--profile]
// (--profile [--case PREFIX]: this tree's scanBody only, in a loop of `--rounds` seconds over the cases
// whose name starts with PREFIX, for `node --cpu-prof`).
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { BENCH_SECRETS, FULL_SET_DOCUMENT, llmRequestBody } from '../../bench/corpus.ts';
import { cpuMs } from './session-measure.ts';

const { values } = parseArgs({
  options: {
    against: { type: 'string' },
    rounds: { type: 'string', default: '15' },
    batch: { type: 'string', default: '2000' },
    profile: { type: 'boolean', default: false },
    only: { type: 'string' },
    case: { type: 'string' },
    cold: { type: 'boolean', default: false },
  },
});
const rounds = Number(values.rounds);
const batch = Number(values.batch);

/** About `bytes` bytes of an Anthropic messages answer, with a planted email. */
function anthropicAnswer(bytes: number): Buffer {
  const head = {
    id: 'msg_01XFDUDYJgAACzvnptvVoYEL',
    type: 'message',
    role: 'assistant',
    model: 'claude-sonnet-4-5',
    content: [{ type: 'text', text: '' }],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage: { input_tokens: 2095, output_tokens: 503 },
  };
  const base = JSON.stringify(head).length;
  head.content[0].text = 'The build failed because the cache key changed; re-run it with a fresh runner. '
    .repeat(8)
    .slice(0, Math.max(0, bytes - base));
  return Buffer.from(JSON.stringify(head));
}

/** About `bytes` bytes of an OpenAI chat completion answer. */
function chatAnswer(bytes: number): Buffer {
  const head = {
    id: 'chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT',
    object: 'chat.completion',
    created: 1741569952,
    model: 'gpt-4o-2024-08-06',
    choices: [
      { index: 0, message: { role: 'assistant', content: '', refusal: null }, logprobs: null, finish_reason: 'stop' },
    ],
    usage: { prompt_tokens: 19, completion_tokens: 10, total_tokens: 29 },
  };
  const base = JSON.stringify(head).length;
  head.choices[0].message.content = 'Sure, here is the summary of the incident and its timeline as requested. '
    .repeat(8)
    .slice(0, Math.max(0, bytes - base));
  return Buffer.from(JSON.stringify(head));
}

/** About `bytes` bytes of a request with one short user message (a turn's new part is often this small). */
function shortRequest(bytes: number): Buffer {
  const head = { model: 'claude-sonnet-4-5', max_tokens: 1024, messages: [{ role: 'user', content: '' }] };
  const base = JSON.stringify(head).length;
  head.messages[0].content = 'Please run the failing test again and tell me what the stack trace says. '
    .repeat(8)
    .slice(0, Math.max(0, bytes - base));
  return Buffer.from(JSON.stringify(head));
}

interface Case {
  name: string;
  body: Buffer;
  phase: 'request' | 'response';
}
const cases: Case[] = [
  { name: 'anthropic answer 300 B (response)', body: anthropicAnswer(300), phase: 'response' },
  { name: 'chat answer 300 B (response)', body: chatAnswer(300), phase: 'response' },
  { name: '4 KB request (request)', body: llmRequestBody(4096), phase: 'request' },
  { name: 'short request 300 B (request)', body: shortRequest(300), phase: 'request' },
];

interface Tree {
  label: string;
  scan: (c: Case) => unknown;
  inspect: (c: Case) => Promise<unknown>;
  close: () => Promise<void>;
}

const secrets = Object.freeze([...BENCH_SECRETS]);

async function load(label: string, dir: string): Promise<Tree> {
  const { policyFromDocument } = await import(resolve(dir, 'pipeline/policy/resolve.ts'));
  const { validatePolicyDocument } = await import(resolve(dir, 'pipeline/policy/validate.ts'));
  const { compilePlan } = await import(resolve(dir, 'pipeline/plan.ts'));
  const { scanBody } = await import(resolve(dir, 'pipeline/scan.ts'));
  const { InspectionEngine } = await import(resolve(dir, 'pipeline/engine.ts'));
  const policy = policyFromDocument(validatePolicyDocument(structuredClone(FULL_SET_DOCUMENT)));
  const plan = compilePlan(policy);
  const engine = new InspectionEngine({ threads: 0, cacheBytes: 0 });
  await engine.inspect({ body: Buffer.from('{"model":"claude-x"}'), phase: 'request', policy, secrets });
  return {
    label,
    scan: (c) => scanBody(plan, { body: c.body, phase: c.phase, secrets }),
    inspect: (c) => engine.inspect({ body: c.body, phase: c.phase, policy, secrets }),
    close: () => engine.close(),
  };
}

const trees = [await load('this tree', resolve(import.meta.dirname, '../..'))];
if (values.against) trees.push(await load('baseline', resolve(values.against)));

// The two trees must find the same things (the findings are compared as JSON).
for (const c of cases) {
  const found = trees.map((t) => JSON.stringify(t.scan(c)));
  console.log(`${c.name}: ${c.body.length} bytes; findings ${found[0]}`);
  if (found.some((f) => f !== found[0])) throw new Error(`${c.name}: the trees' findings differ`);
}

if (values.profile) {
  const t = trees[0];
  const end = Date.now() + Number(values.rounds) * 1000;
  let n = 0;
  const profiled = cases.filter((c) => !values.case || c.name.startsWith(values.case));
  const junk = new Uint8Array(values.cold ? 8 * 1024 * 1024 : 0);
  while (Date.now() < end)
    for (const c of profiled)
      for (let i = 0; i < 1000; i++, n++) {
        if (values.cold) junk.fill(i & 0xff);
        t.scan(c);
      }
  console.log(`${n} scans`);
  process.exit(0);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const key = (t: Tree, c: Case, p: string) => `${p}\u0000${c.name}\u0000${t.label}`;

if (values.cold) {
  const junk = new Uint8Array(8 * 1024 * 1024);
  const cold = new Map<string, number[]>();
  for (let r = 0; r <= rounds; r++)
    for (const c of cases)
      for (const t of r % 2 === 0 ? trees : [...trees].reverse())
        for (let i = 0; i < batch / 20; i++) {
          junk.fill(i & 0xff);
          // The body itself was just read from the socket: in the caches, unlike the code and tables.
          let sum = 0;
          for (let k = 0; k < c.body.length; k += 64) sum += c.body[k];
          if (sum < 0) throw new Error('unreachable');
          const before = performance.now();
          t.scan(c);
          const us = (performance.now() - before) * 1000;
          if (r === 0) continue;
          const k = key(t, c, 'cold scanBody');
          cold.set(k, [...(cold.get(k) ?? []), us]);
        }
  console.log(`\ncold: each scan after 8 MB written elsewhere, wall clock, median of ${(rounds * batch) / 20}`);
  for (const c of cases)
    console.log(
      `| cold scanBody | ${c.name} | ${trees.map((t) => median(cold.get(key(t, c, 'cold scanBody'))!).toFixed(2)).join(' | ')} |`,
    );
}

const paths = (values.only ? [values.only] : ['scanBody', 'inspect']) as ('scanBody' | 'inspect')[];
const samples = new Map<string, number[]>();
for (let r = 0; r <= rounds; r++) {
  for (const p of paths)
    for (const c of cases)
      for (const t of r % 2 === 0 ? trees : [...trees].reverse()) {
        const before = cpuMs();
        if (p === 'scanBody') for (let i = 0; i < batch; i++) t.scan(c);
        else for (let i = 0; i < batch; i++) await t.inspect(c);
        const us = ((cpuMs() - before) * 1000) / batch;
        if (r === 0) continue; // warm-up
        const k = key(t, c, p);
        samples.set(k, [...(samples.get(k) ?? []), us]);
      }
}
for (const t of trees) await t.close();

const { loadavg } = await import('node:os');
console.log(
  `\n${rounds} rounds × ${batch} scans per case, interleaved; load average ${loadavg()
    .map((x) => x.toFixed(2))
    .join(' / ')}`,
);
console.log(`| path | body | ${trees.map((t) => `${t.label} µs`).join(' | ')}${trees.length > 1 ? ' | ratio |' : ''}`);
console.log(`|---|---|${trees.map(() => '---:|').join('')}${trees.length > 1 ? '---:|' : ''}`);
for (const p of paths)
  for (const c of cases) {
    const ms = trees.map((t) => median(samples.get(key(t, c, p))!));
    const ratio = ms.length > 1 ? ` ${(ms[0] / ms[1]).toFixed(2)}× |` : '';
    console.log(`| ${p} | ${c.name} | ${ms.map((m) => m.toFixed(2)).join(' | ')} |${ratio}`);
  }
