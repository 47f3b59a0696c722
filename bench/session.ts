import http from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Agent, request } from 'undici';
import { conditions } from './conditions.ts';
import { BENCH_SECRETS, rng } from './corpus.ts';
import { fullSetSnapshot, listenLocal, writeAgentIdentity, writeJson, writeServerTls } from './fixtures.ts';
import { formatMs, table } from './measure.ts';
import { treeCpuSeconds } from './proc-stats.ts';
import { pinSelf } from './processes.ts';
import {
  FLOOR_PROXY_NAME,
  PORTKEY_GUARDED_NAME,
  portkeyConfig,
  startFloorProxy,
  startLlmproxy,
  startPortkey,
} from './servers.ts';
import { quantile } from './stats.ts';
import type { BenchResult, SummaryRow } from './summary.ts';

// npm run bench -- session [--quick] [--turns N] [--sessions N] [--format anthropic|openai] [--warm-up N, default 3]
// Replays generated agent sessions through llmproxy with the full set on. A session is what a coding
// agent sends: every turn resends the whole conversation (system prompt, tool definitions, each
// assistant tool_use and the tool_result that answered it), growing by ~7.5 KB a turn to ~300 KB at
// turn 40 (or OpenAI Chat Completions with --format openai), with a few findings along the way that are observed, not blocked (an email in a tool result
// at turn 3, an API key at turn 12, an internal host name at turn 25), so the session goes on.
// Contenders, each alone on core 1 (taskset) while this process and the mock upstream share core 0:
// direct (no proxy); dvx with its inspection cache; dvx with `--inspection-cache-mb 0`; dvx with
// inspection off; the floor (node:https + undici pass-through); Portkey with its regex guardrail. dvx
// runs with `--workers 1`.
// Inspected bytes come from dvx's metrics (request body bytes minus the cache's bytes saved), the
// inspection time from `dvx_inspection_duration_seconds` (wall time: a pooled body's round trip), the
// whole-session CPU from /proc (utime + stime of the proxy and every process under it), and the
// inspection CPU by difference: a dvx's proxy CPU less that of the dvx with inspection off.

const TURN_GROWTH = 7.5 * 1024;
/** The contender whose proxy CPU the others' inspection CPU is measured over. */
const INSPECTION_OFF = 'dvx: inspection off';
const SESSION_BASE_SEED = 100;

// ---- the generated session ---------------------------------------------------------------------

const WORDS = (
  'the of and to in is you that it was for on are as with they at be this have from or one had by but not what ' +
  'all were we when your can said there use an each which do how their if will up other about out many then them ' +
  'function return value request response model token stream error retry timeout deploy cluster service query index ' +
  'build test file module import export class method handler config parse render schema migration commit branch'
).split(' ');

const CODE = [
  'export function handler(req, res) {\n  const body = JSON.parse(req.body);\n  if (!body.ok) return res.status(400).send("bad");\n}\n',
  'for (let i = 0; i < items.length; i++) {\n\tconsole.log("item", i, items[i].name);\n}\n',
  'SELECT id, name, created_at FROM users WHERE org_id = 42 ORDER BY created_at DESC LIMIT 100;\n',
  'def retry(fn, attempts=3):\n    for n in range(attempts):\n        try:\n            return fn()\n        except Exception as e:\n            print("retry", n, e)\n',
  '  ✓ parses the header (3 ms)\n  ✓ rejects an empty body (1 ms)\n  ✗ keeps the order of fields\n    expected "a,b" received "b,a"\n',
];

/** What a few tool results carry: found and recorded (severity warn or log), never blocked. */
const FINDINGS: Record<number, string> = {
  3: '\nAuthor: Jane Doe <jane.doe@example.com>\n',
  12: '\n# .env.local\nANTHROPIC_API_KEY=sk-ant-api03-Xy7Qp2Lr9Vt4Kw8Zn1Bc6Df3Gh5Jm0Ns\n',
  25: '\ncurl https://build-7.corp.example.com/status  # INC-204811\n',
};

const TOOLS = [
  { name: 'read_file', description: 'Read a file of the repository', input_schema: schema('path') },
  { name: 'run_shell', description: 'Run a shell command in the sandbox', input_schema: schema('command') },
  { name: 'grep', description: 'Search the repository', input_schema: schema('pattern') },
];

function findingsPlanted(turns: number): string {
  const what: Record<number, string> = {
    3: 'an email',
    12: 'an API key',
    25: 'an internal host name and an incident id',
  };
  const planted = Object.keys(FINDINGS)
    .map(Number)
    .filter((t) => t <= turns)
    .map((t) => `${what[t]} at turn ${t}`);
  return planted.length ? planted.join(', ') : 'none in so few turns (the first is at turn 3)';
}

function schema(field: string) {
  return { type: 'object', properties: { [field]: { type: 'string' } }, required: [field] };
}

function text(rand: () => number, bytes: number): string {
  let out = '';
  while (out.length < bytes) {
    if (rand() < 0.25) out += CODE[Math.floor(rand() * CODE.length)];
    else {
      for (let i = 0; i < 12; i++) out += `${WORDS[Math.floor(rand() * WORDS.length)]} `;
      out += rand() < 0.5 ? '.\n' : ', ';
    }
  }
  return out;
}

export type SessionFormat = 'anthropic' | 'openai';

/** Where each format's calls go, and the model it names. */
const ROUTES: Record<SessionFormat, { path: string; model: string }> = {
  anthropic: { path: '/v1/messages', model: 'claude-sonnet-4-5' },
  openai: { path: '/v1/chat/completions', model: 'gpt-4.1' },
};

const SYSTEM = 'You are a careful coding agent working in a sandboxed repository.';

/**
 * The request bodies of one session, turn 1 to `turns`: each carries every turn before it. Anthropic
 * Messages (tool_use / tool_result blocks) or OpenAI Chat Completions (tool_calls / role "tool").
 */
export function sessionBodies(turns: number, seed: number, format: SessionFormat = 'anthropic'): Buffer[] {
  const rand = rng(seed);
  const task = `Fix the failing test in the parser module (session ${seed}). ${text(rand, 600)}`;
  const messages: unknown[] =
    format === 'openai'
      ? [
          { role: 'system', content: SYSTEM },
          { role: 'user', content: task },
        ]
      : [{ role: 'user', content: task }];
  const bodies: Buffer[] = [];
  for (let turn = 1; turn <= turns; turn++) {
    if (turn > 1) {
      const tool = TOOLS[Math.floor(rand() * TOOLS.length)];
      const id = `toolu_${seed}_${turn}`;
      const said = text(rand, 150 + rand() * 300);
      const input = { [tool.input_schema.required[0]]: `src/${turn}.ts` };
      // Tool results vary in size (a short grep, a long file); on average the turn adds TURN_GROWTH.
      const result = text(rand, Math.round(TURN_GROWTH * (0.3 + 1.4 * rand()))) + (FINDINGS[turn] ?? '');
      if (format === 'openai') {
        messages.push({
          role: 'assistant',
          content: said,
          tool_calls: [{ id, type: 'function', function: { name: tool.name, arguments: JSON.stringify(input) } }],
        });
        messages.push({ role: 'tool', tool_call_id: id, content: result });
      } else {
        messages.push({
          role: 'assistant',
          content: [
            { type: 'text', text: said },
            { type: 'tool_use', id, name: tool.name, input },
          ],
        });
        messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: id, content: result }] });
      }
    }
    const body =
      format === 'openai'
        ? {
            model: ROUTES.openai.model,
            max_tokens: 4096,
            tools: TOOLS.map((t) => ({
              type: 'function',
              function: { name: t.name, description: t.description, parameters: t.input_schema },
            })),
            messages,
          }
        : { model: ROUTES.anthropic.model, max_tokens: 4096, system: SYSTEM, tools: TOOLS, messages };
    bodies.push(Buffer.from(JSON.stringify(body)));
  }
  return bodies;
}

/**
 * What Portkey's regexMatch guardrail reads of a request (its build: the last message's content, and
 * of a content array only the parts' `text`): an Anthropic tool_result part gives it nothing, an
 * OpenAI tool message its whole content.
 */
function portkeyScannedBytes(body: Buffer): number {
  const { messages } = JSON.parse(body.toString()) as { messages: { content: unknown }[] };
  const content = messages[messages.length - 1]?.content;
  if (typeof content === 'string') return Buffer.byteLength(content);
  if (!Array.isArray(content)) return 0;
  return content.reduce((n: number, part: { text?: string }) => n + Buffer.byteLength(part.text ?? ''), 0);
}

// ---- the processes under test --------------------------------------------------------------------

/** The mock upstream (Anthropic and OpenAI): every turn answers with a tool call, as an agent's model does. */
function startUpstream(): Promise<{ url: string; close: () => void }> {
  const openai = JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1763800000,
    model: 'gpt-4.1',
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: null,
          tool_calls: [
            { id: 'call_next', type: 'function', function: { name: 'read_file', arguments: '{"path":"src/next.ts"}' } },
          ],
        },
        finish_reason: 'tool_calls',
      },
    ],
    usage: { prompt_tokens: 1000, completion_tokens: 20, total_tokens: 1020 },
  });
  const anthropic = JSON.stringify({
    id: 'msg_1',
    type: 'message',
    role: 'assistant',
    model: 'claude-sonnet-4-5',
    content: [{ type: 'tool_use', id: 'toolu_next', name: 'read_file', input: { path: 'src/next.ts' } }],
    stop_reason: 'tool_use',
    stop_sequence: null,
    usage: { input_tokens: 1000, output_tokens: 20 },
  });
  return listenLocal(
    http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const reply = req.url?.endsWith('/chat/completions') ? openai : anthropic;
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(reply) });
        res.end(reply);
      });
    }),
  );
}

interface Contender {
  name: string;
  url: string;
  path: string;
  headers: Record<string, string>;
  dispatcher: Agent;
  pid: number | null;
  /** dvx's metrics: sums of the named series (histograms by their _sum and _count). */
  metrics?: () => Promise<Map<string, number>>;
  note?: string;
  /** a fresh agent credential before each session (platform JWTs live under 5 minutes) */
  refresh?: () => Promise<void>;
  stop: () => Promise<void>;
}

/** Prometheus text → sum per metric name over its label sets (request-phase series only when phased). */
function parseMetrics(textBody: string): Map<string, number> {
  const sums = new Map<string, number>();
  for (const line of textBody.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    if (m[2]?.includes('phase=') && !m[2].includes('phase="request"')) continue;
    sums.set(m[1], (sums.get(m[1]) ?? 0) + Number(m[3]));
    // Inspection time also by mode: a body past the inline threshold pays a pool round trip.
    const mode = /mode="(\w+)"/.exec(m[2] ?? '')?.[1];
    if (mode) sums.set(`${m[1]}:${mode}`, (sums.get(`${m[1]}:${mode}`) ?? 0) + Number(m[3]));
  }
  return sums;
}

// ---- the replay ----------------------------------------------------------------------------------

interface Replay {
  /** latency in ms per turn index, one entry per session */
  latency: number[][];
  errors: number;
  cpu: number | null;
  /** metric deltas per turn group (early, late, whole) */
  early?: Map<string, number>;
  late?: Map<string, number>;
  whole?: Map<string, number>;
}

function delta(a: Map<string, number>, b: Map<string, number>): Map<string, number> {
  const out = new Map<string, number>();
  for (const [k, v] of b) out.set(k, v - (a.get(k) ?? 0));
  return out;
}

async function post(c: Contender, body: Buffer): Promise<{ ms: number; ok: boolean }> {
  const t0 = performance.now();
  try {
    const res = await request(`${c.url}${c.path}`, {
      method: 'POST',
      headers: c.headers,
      body,
      dispatcher: c.dispatcher,
    });
    if (res.statusCode !== 200 && process.env.DVX_BENCH_DEBUG)
      process.stderr.write(`${c.name}: HTTP ${res.statusCode} ${(await res.body.text()).slice(0, 300)}\n`);
    await res.body.dump();
    return { ms: performance.now() - t0, ok: res.statusCode === 200 };
  } catch {
    return { ms: performance.now() - t0, ok: false };
  }
}

async function replay(c: Contender, sessions: Buffer[][], group: number): Promise<Replay> {
  const turns = sessions[0].length;
  const latency: number[][] = Array.from({ length: turns }, () => []);
  let errors = 0;
  const zero = new Map<string, number>();
  const early = new Map<string, number>();
  const late = new Map<string, number>();
  const add = (into: Map<string, number>, d: Map<string, number>) => {
    for (const [k, v] of d) into.set(k, (into.get(k) ?? 0) + v);
  };
  const cpu0 = c.pid ? await treeCpuSeconds(c.pid) : null;
  const start = c.metrics ? await c.metrics() : zero;
  for (const bodies of sessions) {
    await c.refresh?.();
    let mark = c.metrics ? await c.metrics() : zero;
    for (let t = 0; t < turns; t++) {
      if (c.metrics && t === turns - group) mark = await c.metrics();
      const r = await post(c, bodies[t]);
      if (r.ok) latency[t].push(r.ms);
      else errors++;
      if (c.metrics && t === group - 1) add(early, delta(mark, await c.metrics()));
    }
    if (c.metrics) add(late, delta(mark, await c.metrics()));
  }
  const cpu = c.pid && cpu0 !== null ? (await treeCpuSeconds(c.pid)) - cpu0 : null;
  const whole = c.metrics ? delta(start, await c.metrics()) : undefined;
  return { latency, errors, cpu, early: c.metrics ? early : undefined, late: c.metrics ? late : undefined, whole };
}

// ---- the benchmark -------------------------------------------------------------------------------

export async function main(args: string[]): Promise<BenchResult> {
  const quick = args.includes('--quick');
  const opt = (name: string, d: number) => {
    const i = args.indexOf(name);
    return i >= 0 && Number(args[i + 1]) > 0 ? Number(args[i + 1]) : d;
  };
  const turns = opt('--turns', 40);
  const formatArg = args[args.indexOf('--format') + 1];
  const format: SessionFormat = args.includes('--format') && formatArg === 'openai' ? 'openai' : 'anthropic';
  const route = ROUTES[format];
  const nSessions = opt('--sessions', quick ? 3 : 10);
  const group = Math.max(1, Math.ceil(turns / 4));
  pinSelf('0');

  const sessions = Array.from({ length: nSessions }, (_, i) => sessionBodies(turns, SESSION_BASE_SEED + i, format));
  // Before its measured sessions each contender replays --warm-up N whole sessions of other seeds
  // (default 3): a process that has served a few hundred calls, its hot paths compiled and its
  // regexes' DFA states built. A fresh dvx's first sessions cost 2–5× its later ones, cache on or off
  // (in process, cache on: about 25, 14 and 10 ms of inspection for its first three sessions after 8
  // turns, 6–7 ms from the fifth on), and the 8-turn warm-up this bench had measured exactly those
  // (docs/decisions.md, "A session's new bytes, and a served proxy"). --warm-up 0: that 8-turn one.
  const warmAt = args.indexOf('--warm-up');
  const warmArg = warmAt >= 0 ? Number(args[warmAt + 1]) : Number.NaN;
  const warmSessions = Number.isInteger(warmArg) && warmArg >= 0 ? warmArg : 3;
  const warmUp =
    warmSessions > 0
      ? Array.from({ length: warmSessions }, (_, i) => sessionBodies(turns, 1 + i, format))
      : [sessionBodies(Math.min(turns, 8), 1, format)];
  const bodyBytes = (from: number, to: number) =>
    sessions.reduce((n, s) => n + s.slice(from, to).reduce((m, b) => m + b.length, 0), 0);
  const earlyBytes = bodyBytes(0, group);
  const lateBytes = bodyBytes(turns - group, turns);
  const wholeBytes = bodyBytes(0, turns);

  const dir = await mkdtemp(join(tmpdir(), 'dvx-session-bench-'));
  const upstream = await startUpstream();
  const { ca, certFile, keyFile } = await writeServerTls(dir);
  const identity = await writeAgentIdentity(dir);
  const token = identity.token;
  const secrets: Record<string, string> = { 'agent:llmproxy.llm.api_key': 'sk-upstream-key' };
  BENCH_SECRETS.forEach((s, i) => {
    secrets[`bench_${i}`] = s;
  });
  const secretsFile = await writeJson(dir, 'secrets.json', { 'agent:agent-b': secrets });
  const snapshotFile = await writeJson(dir, 'snapshot.json', fullSetSnapshot(upstream.url, true));
  const offSnapshotFile = await writeJson(dir, 'snapshot-off.json', fullSetSnapshot(upstream.url, false));

  const tls = new Agent({ connect: { ca: ca.certPem }, connections: 4, keepAliveTimeout: 60_000 });
  const plain = new Agent({ connections: 4, keepAliveTimeout: 60_000 });
  const json: Record<string, string> =
    format === 'openai'
      ? { 'content-type': 'application/json' }
      : { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' };
  // The agent's platform JWT where its SDK puts its key.
  const credential = async (): Promise<[string, string]> =>
    format === 'openai' ? ['authorization', `Bearer ${await token()}`] : ['x-api-key', await token()];
  const notes: string[] = [];

  /**
   * dvx llmproxy with the full set (or the snapshot given), `--workers 1` and the given flags
   * (servers.ts drops one it does not know).
   */
  const startDvx = async (name: string, port: number, extra: string[], snapshot = snapshotFile): Promise<Contender> => {
    const metricsPort = port + 100;
    const dvx = await startLlmproxy({
      name,
      port,
      metricsPort,
      certFile,
      keyFile,
      jwksFile: identity.jwksFile,
      snapshotFile: snapshot,
      secretsFile,
      tls,
      flags: ['--workers', '1', ...extra],
    });
    const note = dvx.dropped.length
      ? `${name}: started without ${dvx.dropped.join(', ')} (unknown flag in this dvx)`
      : '';
    if (note) notes.push(note);
    const [header, value] = await credential();
    const headers: Record<string, string> = { ...json, [header]: value };
    return {
      name,
      url: dvx.url,
      path: route.path,
      headers,
      refresh: async () => {
        headers[header] = (await credential())[1];
      },
      dispatcher: tls,
      pid: dvx.pid,
      note,
      metrics: async () => {
        const res = await request(`https://127.0.0.1:${metricsPort}/metrics`, { dispatcher: tls });
        return parseMetrics(await res.body.text());
      },
      stop: dvx.stop,
    };
  };

  const starters: (() => Promise<Contender>)[] = [
    async () => ({
      name: 'direct (no proxy)',
      url: upstream.url,
      path: route.path,
      headers: json,
      dispatcher: plain,
      pid: null,
      stop: async () => {},
    }),
    () => startDvx('dvx: full set, inspection cache on', 18580, []),
    () => startDvx('dvx: full set, --inspection-cache-mb 0', 18581, ['--inspection-cache-mb', '0']),
    () => startDvx(INSPECTION_OFF, 18582, [], offSnapshotFile),
    async () => {
      const floor = await startFloorProxy({ dir, certFile, keyFile, upstreamUrl: upstream.url });
      return {
        name: FLOOR_PROXY_NAME,
        url: floor.url,
        path: route.path,
        headers: json,
        dispatcher: tls,
        pid: floor.pid,
        stop: floor.stop,
      };
    },
    async () => {
      const portkey = await startPortkey(18789, plain);
      return {
        name: PORTKEY_GUARDED_NAME,
        url: portkey.url,
        path: route.path,
        headers: {
          'content-type': 'application/json',
          'x-portkey-config': JSON.stringify(portkeyConfig(format, upstream.url, true)),
        },
        dispatcher: plain,
        pid: portkey.pid,
        stop: portkey.stop,
      };
    },
  ];

  const results: { c: Contender; r: Replay }[] = [];
  const failed: string[][] = [];
  for (const start of starters) {
    let c: Contender;
    try {
      c = await start();
    } catch (err) {
      failed.push([`(could not start: ${(err as Error).message.slice(0, 200)})`]);
      continue;
    }
    try {
      await replay(c, warmUp, 1);
      results.push({ c, r: await replay(c, sessions, group) });
    } finally {
      await c.stop();
    }
  }
  upstream.close();
  await tls.close();
  await plain.close();
  await rm(dir, { recursive: true, force: true });

  // ---- the table -------------------------------------------------------------------------------
  const direct = results.find((x) => x.c.pid === null)?.r;
  const turnsOf = (r: Replay, from: number, to: number) => r.latency.slice(from, to).flat();
  const added = (r: Replay, from: number, to: number, q: number) =>
    direct ? quantile(turnsOf(r, from, to), q) - quantile(turnsOf(direct, from, to), q) : NaN;
  const kb = (b: number) => `${(b / 1024).toFixed(1)} KB`;
  const saved = (m?: Map<string, number>) => m?.get('dvx_inspection_cache_bytes_saved_total') ?? 0;
  const inspectedPerTurn = (r: Replay, m: Map<string, number> | undefined, bytes: number) =>
    r.early ? kb((bytes - saved(m)) / (group * nSessions)) : '';
  const inspectionSeconds = (r: Replay) => r.whole?.get('dvx_inspection_duration_seconds_sum') ?? NaN;
  const portkeyBytes = (from: number, to: number) =>
    sessions.reduce((n, sess) => n + sess.slice(from, to).reduce((m, b) => m + portkeyScannedBytes(b), 0), 0) /
    (group * nSessions);
  // Asked for no cache and started with the flag: no hits or misses is what it should count.
  const cacheOff = (c: Contender) =>
    c.name.includes('cache-mb 0') && !c.note?.split('started without')[1]?.includes('--inspection-cache-mb');
  const rows = results
    .filter((x) => x.c.pid !== null)
    .map(({ c, r }) => {
      if (c.name === INSPECTION_OFF)
        return [
          c.name,
          'none (inspection off)',
          `${formatMs(Math.max(0, added(r, 0, group, 0.5)))} / ${formatMs(Math.max(0, added(r, turns - group, turns, 0.5)))}`,
          `${formatMs(Math.max(0, added(r, 0, group, 0.99)))} / ${formatMs(Math.max(0, added(r, turns - group, turns, 0.99)))}`,
          r.cpu === null ? '' : formatMs((r.cpu * 1000) / nSessions),
          '',
          '',
          '',
          String(r.errors),
        ];
      const isDvx = !!r.whole;
      const hits = r.whole?.get('dvx_inspection_cache_hits_total');
      const misses = r.whole?.get('dvx_inspection_cache_misses_total');
      return [
        c.name,
        isDvx
          ? `${inspectedPerTurn(r, r.early, earlyBytes)} / ${inspectedPerTurn(r, r.late, lateBytes)}`
          : c.name.startsWith('floor')
            ? 'none (no inspection)'
            : `${kb(portkeyBytes(0, group))} / ${kb(portkeyBytes(turns - group, turns))} (last message's text only)`,
        `${formatMs(Math.max(0, added(r, 0, group, 0.5)))} / ${formatMs(Math.max(0, added(r, turns - group, turns, 0.5)))}`,
        `${formatMs(Math.max(0, added(r, 0, group, 0.99)))} / ${formatMs(Math.max(0, added(r, turns - group, turns, 0.99)))}`,
        r.cpu === null ? '' : formatMs((r.cpu * 1000) / nSessions),
        isDvx
          ? `${formatMs((inspectionSeconds(r) * 1000) / nSessions)} (pool ${formatMs(((r.whole?.get('dvx_inspection_duration_seconds_sum:pool') ?? 0) * 1000) / nSessions)}, ${r.whole?.get('dvx_inspection_duration_seconds_count:pool') ?? 0} runs)`
          : '',
        isDvx ? (hits !== undefined ? `${hits} / ${misses ?? 0}` : cacheOff(c) ? 'off' : 'no cache metric') : '',
        isDvx ? String(r.whole?.get('dvx_inspection_findings_total') ?? 0) : '',
        String(r.errors),
      ];
    });
  const cached = results.find((x) => x.c.name.includes('cache on'))?.r;
  const uncached = results.find((x) => x.c.name.includes('cache-mb 0'))?.r;
  const ratio = cached && uncached ? inspectionSeconds(uncached) / inspectionSeconds(cached) : NaN;
  const bytesRatio =
    cached?.whole && uncached?.whole
      ? (wholeBytes - saved(uncached.whole)) / Math.max(1, wholeBytes - saved(cached.whole))
      : NaN;
  const cpuRatio = cached?.cpu && uncached?.cpu ? uncached.cpu / cached.cpu : NaN;
  // Inspection CPU by difference: each dvx's proxy CPU less the same dvx's with inspection off (the
  // same calls, scrapes and sessions; the pool's workers and V8's helper threads counted with it).
  const off = results.find((x) => x.c.name === INSPECTION_OFF)?.r;
  const inspectionCpu = (r?: Replay) =>
    r?.cpu != null && off?.cpu != null ? Math.max(0, r.cpu - off.cpu) / nSessions : Number.NaN;
  const cpuInspectionRatio = inspectionCpu(uncached) / inspectionCpu(cached);

  const earlyLabel = `turns 1–${group}`;
  const lateLabel = `turns ${turns - group + 1}–${turns}`;
  const markdown = [
    `## session — ${conditions(`${nSessions} generated sessions of ${turns} turns (${format === 'openai' ? 'OpenAI Chat Completions, tool_calls + tool messages' : 'Anthropic Messages, tool_use + tool_result'}, ${kb(sessions[0][0].length)} → ${kb(sessions[0][turns - 1].length)}), each turn resending the whole conversation, one call at a time; warm-up ${warmSessions > 0 ? `${warmSessions} whole session${warmSessions > 1 ? 's' : ''}` : 'one session of 8 turns'} per contender (a served proxy, not a fresh one); early = ${earlyLabel}, late = ${lateLabel}; added = the contender's p50 (p99) minus direct's over the same turns; CPU = utime + stime of the proxy's processes over the measured sessions (dvx's includes four metric scrapes a session)`, 'the proxy alone on core 1, this process and the mock upstream on core 0 (taskset)')}`,
    '',
    table(
      [
        'contender',
        'inspected per turn, early / late',
        'added p50, early / late',
        'added p99, early / late',
        'proxy CPU per session',
        'inspection time per session (of it on the pool, runs there)',
        'cache hits / misses',
        'findings recorded',
        'errors',
      ],
      [...rows, ...failed.map((f) => [f[0], '', '', '', '', '', '', '', ''])],
    ),
    '',
    `Body per turn: ${kb(earlyBytes / (group * nSessions))} early, ${kb(lateBytes / (group * nSessions))} late; ${kb(wholeBytes / nSessions)} sent per session. Findings planted: ${findingsPlanted(turns)}; observed, none blocking; every later turn carries them again (the findings column counts each time one is recorded, over all sessions). dvx inspects the whole body less what its cache has seen; Portkey's regex guardrail reads only the last message's ${format === 'openai' ? 'content (here the tool message)' : 'text parts (a tool_result gives it nothing)'}, so its column is what it reads, not what it is sent.`,
    '',
    `Inspection time, no cache / cache: ${Number.isFinite(ratio) ? `${ratio.toFixed(2)}×` : '—'} (goal ≥ 10× over ${turns} turns); inspected bytes, no cache / cache: ${Number.isFinite(bytesRatio) ? `${bytesRatio.toFixed(2)}×` : '—'}; whole-process CPU, no cache / cache: ${Number.isFinite(cpuRatio) ? `${cpuRatio.toFixed(2)}×` : '—'}; inspection CPU (proxy CPU less dvx's with inspection off: ${formatMs(inspectionCpu(uncached) * 1000)} against ${formatMs(inspectionCpu(cached) * 1000)} a session), no cache / cache: ${Number.isFinite(cpuInspectionRatio) ? `${cpuInspectionRatio.toFixed(2)}×` : '—'}.`,
    ...(notes.length ? ['', ...notes.map((n) => `Note: ${n}.`)] : []),
    ...(cached?.whole && !cached.whole.has('dvx_inspection_cache_hits_total')
      ? [
          '',
          'Note: this dvx has no inspection cache (no dvx_inspection_cache_* metric): both dvx rows run the same code, and their ratios are noise.',
        ]
      : []),
    '',
  ].join('\n');
  process.stdout.write(markdown);

  const cell = (name: string, col: number) =>
    (rows.find((r) => r[0].startsWith(name))?.[col] ?? '').replace(/ \(.*$/, '');
  const summary: SummaryRow[] = [
    {
      bench: 'session',
      measure: `inspection time per ${turns}-turn session, cache vs --inspection-cache-mb 0`,
      ours: cell('dvx: full set, inspection cache on', 5),
      baseline: cell('dvx: full set, --inspection-cache-mb 0', 5),
      ratio: Number.isFinite(ratio) ? 1 / ratio : null,
      goal: '≤ 0.10×',
    },
    {
      bench: 'session',
      measure: `bytes inspected per ${turns}-turn session, cache vs --inspection-cache-mb 0`,
      ours: cached?.whole ? kb((wholeBytes - saved(cached.whole)) / nSessions) : '',
      baseline: uncached?.whole ? kb((wholeBytes - saved(uncached.whole)) / nSessions) : '',
      ratio: Number.isFinite(bytesRatio) ? 1 / bytesRatio : null,
    },
    {
      bench: 'session',
      measure: `inspection CPU per ${turns}-turn session (proxy CPU less dvx's with inspection off), cache vs --inspection-cache-mb 0`,
      ours: Number.isFinite(inspectionCpu(cached)) ? formatMs(inspectionCpu(cached) * 1000) : '',
      baseline: Number.isFinite(inspectionCpu(uncached)) ? formatMs(inspectionCpu(uncached) * 1000) : '',
      ratio: Number.isFinite(cpuInspectionRatio) ? 1 / cpuInspectionRatio : null,
    },
    {
      bench: 'session',
      measure: `proxy CPU per ${turns}-turn session, cache vs --inspection-cache-mb 0`,
      ours: cell('dvx: full set, inspection cache on', 4),
      baseline: cell('dvx: full set, --inspection-cache-mb 0', 4),
      ratio: Number.isFinite(cpuRatio) ? 1 / cpuRatio : null,
    },
  ];
  const floorRow = results.find((x) => x.c.name.startsWith('floor'))?.r;
  const portkeyRow = results.find((x) => x.c.name.startsWith('@portkey'))?.r;
  for (const [label, base] of [
    ['the floor', floorRow],
    ['Portkey + regex guardrail', portkeyRow],
  ] as const) {
    if (!cached || !base) continue;
    const ours = added(cached, turns - group, turns, 0.5);
    const theirs = added(base, turns - group, turns, 0.5);
    summary.push({
      bench: 'session',
      measure: `added p50 late in the session (${lateLabel}), dvx with cache vs ${label}`,
      ours: formatMs(Math.max(0, ours)),
      baseline: formatMs(Math.max(0, theirs)),
      ratio: theirs > 0 ? Math.max(0, ours) / theirs : null,
    });
  }
  return { summary };
}
