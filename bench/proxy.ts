import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { generateCa, issueCertificate } from '../core/tls.ts';
import { BENCH_PATTERNS, llmRequestBody } from './corpus.ts';
import { conditions, formatMs, table } from './measure.ts';
import { startToolUpstream, toolCallProfile, writeToolSnapshots, type ToolContender } from './tool-call-profile.ts';

// npm run bench -- proxy [--quick] [--workers 1,2] [--rates 500,1000,2000] [--seconds S] [--no-extras]
// Added latency over direct at fixed request rates, one table: the mock Anthropic upstream and this
// load generator share core 0; each single-process proxy runs alone on core 1 (taskset). Contenders:
// direct; the floor (bare node:https + undici pass-through); dvx with inspection off; dvx with the full
// set (all built-ins + 10 RE2 patterns) once per `--workers` value; @portkey-ai/gateway plain and with
// its regex guardrail. dvx with more than one worker is given both cores (0-1), so it shares core 0 with
// the load generator and the upstream; the floor is then run a second time on cores 0-1 and that
// floor is the one its ratios are taken against. Every request carries a body of its own (a counter in
// each message), so the inspection cache, left at its default, never sees a part twice.
// Then time-to-first-token through each for an SSE answer, and the memory a 32 MB request costs dvx.
// Then the tool-call profile (tool-call-profile.ts): an answer with tool calls, with and without a tool
// policy. --no-extras stops after the latency table (short verification runs).

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NODE = process.execPath;
const REPLY = JSON.stringify({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: 'claude-sonnet-4-5',
  content: [{ type: 'text', text: 'ok' }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage: { input_tokens: 10, output_tokens: 1 },
});

function startUpstream(): Promise<{ port: number; close: () => void }> {
  const server = http.createServer((req, res) => {
    // A request asks for a stream the way clients do: `"stream": true` in the body.
    let streamed = false;
    req.on('data', (c: Buffer) => {
      if (!streamed && c.includes('"stream":true')) streamed = true;
    });
    req.on('end', () => {
      if (streamed) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(
          `event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', model: 'x', content: [], usage: { input_tokens: 1, output_tokens: 1 } } })}\n\n`,
        );
        res.write(
          `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'first' } })}\n\n`,
        );
        setTimeout(() => res.end(`event: message_stop\ndata: {"type":"message_stop"}\n\n`), 5);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(REPLY) });
      res.end(REPLY);
    });
  });
  server.keepAliveTimeout = 60_000;
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({ port: (server.address() as { port: number }).port, close: () => server.close() }),
    ),
  );
}

interface Contender {
  name: string;
  url: string;
  path: string;
  headers: Record<string, string>;
  pid: number | null;
  stop: () => Promise<void>;
  /** The cores it is pinned to (null: direct); its ratios are against the floor pinned the same way. */
  cores: string | null;
  isFloor?: boolean;
}

function option(args: string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : undefined;
}

async function waitFor(check: () => Promise<boolean>, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

function pinned(args: string[], env: Record<string, string> = {}, cores = '1'): ChildProcess {
  return spawn('taskset', ['-c', cores, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const done = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), 5000);
  await done;
  clearTimeout(t);
}

function rssOf(pid: number | null): Promise<number | null> {
  if (!pid) return Promise.resolve(null);
  return readFile(`/proc/${pid}/status`, 'utf8').then(
    (s) => Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? 0) * 1024,
    () => null,
  );
}

/** RSS of a process and all its descendants (dvx with --workers N is a primary and N workers). */
async function treeRss(pid: number | null): Promise<number | null> {
  if (!pid) return null;
  const own = await rssOf(pid);
  if (own === null) return null;
  let children: number[] = [];
  try {
    const tasks = await readdir(`/proc/${pid}/task`);
    for (const task of tasks) {
      const list = await readFile(`/proc/${pid}/task/${task}/children`, 'utf8').catch(() => '');
      children = children.concat(list.split(' ').filter(Boolean).map(Number));
    }
  } catch {
    // Gone between the two reads: its own RSS is what there is.
  }
  let total = own;
  for (const child of children) total += (await treeRss(child)) ?? 0;
  return total;
}

/**
 * Request bodies that differ in every message: the corpus body with a fixed-width counter at the start
 * of each message's text, rewritten per request in a copy. Parts never repeat, so a per-part inspection
 * cache cannot make a contender look faster than it is on fresh traffic.
 */
function freshBodies(template: Buffer): () => Buffer {
  const marker = Buffer.from('"content":"');
  const width = 10;
  const parts: Buffer[] = [];
  const slots: number[] = [];
  let from = 0;
  let length = 0;
  for (let at = template.indexOf(marker); at >= 0; at = template.indexOf(marker, at + 1)) {
    const head = template.subarray(from, at + marker.length);
    parts.push(head, Buffer.from(`${'0'.repeat(width)} `));
    length += head.length;
    slots.push(length);
    length += width + 1;
    from = at + marker.length;
  }
  parts.push(template.subarray(from));
  const body = Buffer.concat(parts);
  let n = 0;
  return () => {
    const copy = Buffer.from(body);
    const tag = (n++).toString(36).padStart(width, '0');
    for (const slot of slots) copy.write(tag, slot, width, 'latin1');
    return copy;
  };
}

/** The proxy process under taskset is `taskset`'s child after exec: same pid. */
function pidOf(child: ChildProcess): number | null {
  return child.pid ?? null;
}

interface RunResult {
  p50: number;
  p99: number;
  achieved: number;
  errors: number;
}

/** Open-loop load: requests leave on schedule whatever the answers do; latency is measured per request. */
async function openLoop(
  dispatcher: Agent,
  c: Contender,
  body: () => Buffer,
  rate: number,
  seconds: number,
): Promise<RunResult> {
  const total = Math.round(rate * seconds);
  const interval = 1000 / rate;
  const latencies: number[] = [];
  let errors = 0;
  const started = performance.now();
  const inflight: Promise<void>[] = [];
  // Every tick sends the requests now due; no busy-waiting, so this core stays free for the upstream.
  let sent = 0;
  while (sent < total) {
    const due = Math.min(total, Math.floor((performance.now() - started) / interval) + 1);
    for (; sent < due; sent++) {
      const t0 = performance.now();
      inflight.push(
        request(`${c.url}${c.path}`, { method: 'POST', headers: c.headers, body: body(), dispatcher }).then(
          async (res) => {
            await res.body.dump();
            if (res.statusCode !== 200) errors++;
            else latencies.push(performance.now() - t0);
          },
          () => {
            errors++;
          },
        ),
      );
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  await Promise.all(inflight);
  const elapsed = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? NaN;
  return { p50: at(0.5), p99: at(0.99), achieved: latencies.length / elapsed, errors };
}

/**
 * Closed-loop warm-up (4 requests in flight): enough calls that V8 has optimized the hot path of every
 * contender before it is measured (a few hundred open-loop requests left the larger proxies still
 * running baseline code, which measured the JIT, not the proxy).
 */
async function warmUp(dispatcher: Agent, c: Contender, body: () => Buffer, seconds: number): Promise<void> {
  const end = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      while (performance.now() < end) {
        const res = await request(`${c.url}${c.path}`, {
          method: 'POST',
          headers: c.headers,
          body: body(),
          dispatcher,
        }).catch(() => null);
        await res?.body.dump();
      }
    }),
  );
}

async function ttft(dispatcher: Agent, c: Contender, n: number): Promise<number> {
  const body = JSON.stringify({
    stream: true,
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'hi' }],
  });
  const xs: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const res = await request(`${c.url}${c.path}`, { method: 'POST', headers: c.headers, body, dispatcher });
    let first = 0;
    for await (const chunk of res.body) {
      if (!first && String(chunk).includes('content_block_delta')) first = performance.now() - t0;
    }
    // A stream that never carried a delta counts as failed: the median is of streams that did, and
    // NaN when more than half failed.
    if (first) xs.push(first);
  }
  if (xs.length * 2 < n) return NaN;
  xs.sort((a, b) => a - b);
  return xs[Math.floor(xs.length / 2)];
}

export async function main(args: string[]): Promise<void> {
  const quick = args.includes('--quick');
  const seconds = Number(option(args, '--seconds') ?? (quick ? 1 : 3));
  // 2,000 req/s is near what one core generates with the upstream beside it even with no proxy
  // (see RESULTS.md): read its direct row before the others.
  const rates = (option(args, '--rates') ?? '500,1000,2000').split(',').map(Number);
  const workers = (option(args, '--workers') ?? '1,2').split(',').map(Number);
  const extras = !args.includes('--no-extras');
  const sizes = [4 * 1024, 64 * 1024];
  // This process (load generator + upstream) on core 0.
  spawn('taskset', ['-p', '-c', '0', String(process.pid)], { stdio: 'ignore' });

  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-'));
  const upstream = await startUpstream();
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
  const ca = await generateCa();
  const leaf = await issueCertificate(ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
  await writeFile(join(dir, 'cert.pem'), leaf.certPem);
  await writeFile(join(dir, 'key.pem'), leaf.keyPem);
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  await writeFile(
    join(dir, 'jwks.json'),
    JSON.stringify({ keys: [{ ...(await exportJWK(publicKey)), kid: 'b', alg: 'ES256' }] }),
  );
  const token = () =>
    new SignJWT({ org_id: 'org-b' })
      .setProtectedHeader({ alg: 'ES256', kid: 'b' })
      .setSubject('agent-b')
      .setIssuedAt()
      .setExpirationTime('290s')
      .sign(privateKey);
  await writeFile(
    join(dir, 'secrets.json'),
    JSON.stringify({
      'agent:agent-b': { 'agent:llmproxy.llm.api_key': 'sk-upstream-key', db: 's3cr3t-db-password-2026' },
    }),
  );
  const snapshot = (inspect: boolean) => ({
    version: 'bench',
    enclave: { id: 'e', name: 'bench', isolation_class: 'vm' },
    platform: { downstream_url: { value: upstreamUrl } },
    orgs: {
      'org-b': {
        flags: { 'inspect:llm': inspect, 'audit:llm': true },
        config: {
          content_inspection: {
            value: {
              secrets_filter: { enabled: true },
              pii_detection: { enabled: true },
              api_key_detection: { enabled: true },
              patterns: BENCH_PATTERNS,
            },
          },
        },
      },
    },
    agents: {},
  });
  await writeFile(join(dir, 'snap-off.json'), JSON.stringify(snapshot(false)));
  await writeFile(join(dir, 'snap-on.json'), JSON.stringify(snapshot(true)));

  const tls = new Agent({ connect: { ca: ca.certPem }, connections: 128, keepAliveTimeout: 60_000, pipelining: 1 });
  const plain = new Agent({ connections: 128, keepAliveTimeout: 60_000 });
  /** dvx's llmproxy on core 1 with the bench's TLS, keys and secrets, once it answers its health check. */
  // `--workers` is passed whenever this dvx knows it (its default is one worker per core, which would
  // give the one-core rows two); a dvx without it runs one process, so N > 1 cannot start there.
  const knowsWorkers = await new Promise<boolean>((resolve) => {
    const help = spawn(NODE, [join(ROOT, 'cli/main.ts'), 'serve', 'llmproxy', '--help'], { stdio: 'pipe' });
    let out = '';
    help.stdout.on('data', (d: Buffer) => (out += d));
    help.on('close', () => resolve(out.includes('--workers')));
  });
  const startDvx = async (
    port: number,
    snapshot: string,
    n = 1,
    cores = '1',
  ): Promise<{ child: ChildProcess; url: string }> => {
    if (!knowsWorkers && n !== 1) throw new Error(`this dvx has no --workers flag (asked for ${n})`);
    const child = pinned(
      [
        NODE,
        join(ROOT, 'cli/main.ts'),
        'serve',
        'llmproxy',
        '--addr',
        `127.0.0.1:${port}`,
        '--tls-cert',
        join(dir, 'cert.pem'),
        '--tls-key',
        join(dir, 'key.pem'),
        '--agent-jwks',
        join(dir, 'jwks.json'),
        '--policy-snapshot',
        snapshot,
        '--secrets-file',
        join(dir, 'secrets.json'),
        '--log-level',
        'error',
        ...(knowsWorkers ? ['--workers', String(n)] : []),
      ],
      {},
      cores,
    );
    const url = `https://127.0.0.1:${port}`;
    await waitFor(async () => (await request(`${url}/healthz`, { dispatcher: tls })).statusCode === 200, 'dvx');
    return { child, url };
  };

  const PORTKEY_GUARDED = '@portkey-ai/gateway + regex guardrail';
  const direct: Contender = {
    name: 'direct (no proxy)',
    url: upstreamUrl,
    path: '/v1/messages',
    headers: { 'content-type': 'application/json' },
    pid: null,
    stop: async () => {},
    cores: null,
  };
  const startFloor = async (cores: string): Promise<Contender> => {
    const portFile = join(dir, `floor-${cores}.port`);
    const child = pinned(
      [NODE, join(ROOT, 'bench/floor-proxy.ts'), join(dir, 'cert.pem'), join(dir, 'key.pem'), upstreamUrl, portFile],
      {},
      cores,
    );
    await waitFor(async () => (await readFile(portFile, 'utf8')).length > 0, 'floor proxy');
    const port = Number(await readFile(portFile, 'utf8'));
    return {
      name: `floor: node:https + undici pass-through${cores === '1' ? '' : ` (cores ${cores})`}`,
      url: `https://127.0.0.1:${port}`,
      path: '/v1/messages',
      headers: { 'content-type': 'application/json' },
      pid: pidOf(child),
      stop: () => stopChild(child),
      cores,
      isFloor: true,
    };
  };
  const startDvxContender = async (inspect: boolean, n: number): Promise<Contender> => {
    const cores = n > 1 ? '0-1' : '1';
    const port = 18480 + (inspect ? 1 : 0) + 10 * n;
    const { child, url } = await startDvx(port, join(dir, inspect ? 'snap-on.json' : 'snap-off.json'), n, cores);
    return {
      name: `${inspect ? 'dvx: full inspection (built-ins + 10 RE2)' : 'dvx: inspection off'}, --workers ${n}${n > 1 ? ` (cores ${cores})` : ''}`,
      url,
      path: '/v1/messages',
      headers: { 'content-type': 'application/json', 'x-api-key': await token(), 'anthropic-version': '2023-06-01' },
      pid: pidOf(child),
      stop: () => stopChild(child),
      cores,
    };
  };
  const starters: (() => Promise<Contender>)[] = [
    () => startFloor('1'),
    ...(workers.some((n) => n > 1) ? [() => startFloor('0-1')] : []),
    () => startDvxContender(false, 1),
    ...workers.map((n) => () => startDvxContender(true, n)),
    ...[false, true].map((guard) => async (): Promise<Contender> => {
      const port = 18787 + (guard ? 1 : 0);
      const child = pinned(
        [NODE, join(ROOT, 'node_modules/@portkey-ai/gateway/build/start-server.js'), `--port=${port}`, '--headless'],
        { NODE_ENV: 'production' },
      );
      const url = `http://127.0.0.1:${port}`;
      await waitFor(async () => (await request(`${url}/`, { dispatcher: plain })).statusCode === 200, 'portkey');
      const config: Record<string, unknown> = {
        provider: 'anthropic',
        api_key: 'sk-upstream-key',
        custom_host: `${upstreamUrl}/v1`,
      };
      if (guard)
        config.input_guardrails = [
          {
            id: 'g1',
            deny: true,
            'default.regexMatch': { rule: BENCH_PATTERNS[0].pattern.replace('(?i)', ''), not: true },
          },
        ];
      return {
        name: guard ? PORTKEY_GUARDED : '@portkey-ai/gateway',
        url,
        path: '/v1/messages',
        headers: { 'content-type': 'application/json', 'x-portkey-config': JSON.stringify(config) },
        pid: pidOf(child),
        stop: () => stopChild(child),
        cores: '1',
      };
    }),
  ];

  const bodies = new Map(sizes.map((s) => [s, freshBodies(llmRequestBody(s, 3))]));
  const rows: string[][] = [];
  const COLUMNS = 13;
  /** Each row's added p50, to set it against Portkey's with its guardrail once that has run. */
  const addedP50 = new Map<string[], { key: string; p50: number }>();
  /** Direct's p50/p99 per size and rate, then each floor's added p50/p99 per pinning, size and rate. */
  const directAt = new Map<string, RunResult>();
  const floorAdded = new Map<string, { p50: number; p99: number }>();
  const ratio = (ours: number, floor: number | undefined) =>
    floor !== undefined && floor > 0 && Number.isFinite(ours) ? `${(Math.max(0, ours) / floor).toFixed(2)}×` : '';
  const ttfts: string[][] = [];
  const run = async (c: Contender) => {
    const dispatcher = c.url.startsWith('https') ? tls : plain;
    for (const size of sizes) {
      const body = bodies.get(size)!;
      await warmUp(dispatcher, c, body, quick ? 1 : 2);
      for (const rate of rates) {
        const r = await openLoop(dispatcher, c, body, rate, seconds);
        const key = `${size}:${rate}`;
        if (c.cores === null) directAt.set(key, r);
        const d = directAt.get(key);
        const added = d ? { p50: r.p50 - d.p50, p99: r.p99 - d.p99 } : { p50: NaN, p99: NaN };
        if (c.isFloor) floorAdded.set(`${c.cores}:${key}`, added);
        const floor = floorAdded.get(`${c.cores}:${key}`);
        const row = [
          c.name,
          `${size / 1024} KB`,
          String(rate),
          formatMs(r.p50),
          formatMs(r.p99),
          Number.isFinite(added.p50) ? formatMs(Math.max(0, added.p50)) : '',
          Number.isFinite(added.p99) ? formatMs(Math.max(0, added.p99)) : '',
          c.cores === null ? '' : ratio(added.p50, floor?.p50),
          c.cores === null ? '' : ratio(added.p99, floor?.p99),
          '',
          r.achieved.toFixed(0),
          String(r.errors),
          '',
        ];
        rows.push(row);
        if (c.cores !== null) addedP50.set(row, { key, p50: added.p50 });
      }
    }
    const rss = await treeRss(c.pid);
    for (const row of rows) if (row[0] === c.name) row[COLUMNS - 1] = rss ? `${(rss / 1e6).toFixed(0)} MB` : '';
    if (!extras) return;
    const first = await ttft(dispatcher, c, quick ? 20 : 100);
    // Portkey 1.15 answers a streamed call 500 under Node ("TypeError: immutable" when it adds
    // headers to the fetch Response: Portkey-AI/gateway#1389, #1550), so it has no first token.
    ttfts.push([c.name, Number.isFinite(first) ? formatMs(first) : 'no token: the stream failed']);
  };

  await run(direct);
  let memory = '';
  for (const start of starters) {
    let c: Contender;
    try {
      c = await start();
    } catch (err) {
      rows.push([`(could not start: ${(err as Error).message})`, ...Array<string>(COLUMNS - 1).fill('')]);
      continue;
    }
    try {
      await run(c);
      if (extras && c.name.startsWith('dvx: full') && c.cores === '1') {
        const before = (await rssOf(c.pid)) ?? 0;
        const big = Buffer.from(
          JSON.stringify({
            model: 'claude-sonnet-4-5',
            max_tokens: 8,
            messages: [{ role: 'user', content: 'x'.repeat(32 * 1024 * 1024 - 200) }],
          }),
        );
        let peak = before;
        const sampler = setInterval(() => void rssOf(c.pid).then((r) => (peak = Math.max(peak, r ?? 0))), 5);
        const res = await request(`${c.url}${c.path}`, {
          method: 'POST',
          headers: c.headers,
          body: big,
          dispatcher: tls,
        });
        await res.body.dump();
        clearInterval(sampler);
        memory = `32 MB request through dvx (full inspection): status ${res.statusCode}, RSS ${(before / 1e6).toFixed(0)} MB → peak ${(peak / 1e6).toFixed(0)} MB (+${((peak - before) / big.length).toFixed(2)}× the body).`;
      }
    } finally {
      await c.stop();
    }
  }
  upstream.close();
  // Added p50 against Portkey's with its regex guardrail at the same body and rate (below 1×: ahead).
  const guarded = new Map([...addedP50].filter(([row]) => row[0] === PORTKEY_GUARDED).map(([, v]) => [v.key, v.p50]));
  for (const [row, { key, p50 }] of addedP50) row[9] = ratio(p50, guarded.get(key));

  let tools = '';
  if (extras) {
    // The tool-call profile: its own upstream (answers with tool calls), the floor and dvx before it.
    const toolUpstream = await startToolUpstream();
    const snaps = await writeToolSnapshots(dir, toolUpstream.url);
    const started: { stop: () => Promise<void> }[] = [];
    try {
      const floorPortFile = join(dir, 'floor-tools.port');
      const floor = pinned([
        NODE,
        join(ROOT, 'bench/floor-proxy.ts'),
        join(dir, 'cert.pem'),
        join(dir, 'key.pem'),
        toolUpstream.url,
        floorPortFile,
      ]);
      started.push({ stop: () => stopChild(floor) });
      await waitFor(async () => (await readFile(floorPortFile, 'utf8')).length > 0, 'floor proxy');
      const json = { 'content-type': 'application/json' };
      const contenders: ToolContender[] = [
        { name: 'direct (no proxy)', url: toolUpstream.url, headers: json, dispatcher: plain, baseline: true },
        {
          name: 'floor: node:https + undici pass-through',
          url: `https://127.0.0.1:${Number(await readFile(floorPortFile, 'utf8'))}`,
          headers: json,
          dispatcher: tls,
        },
      ];
      for (const [on, port] of [
        [false, 18482],
        [true, 18483],
      ] as const) {
        const { child, url } = await startDvx(port, on ? snaps.on : snaps.off);
        started.push({ stop: () => stopChild(child) });
        contenders.push({
          name: on ? 'dvx: tool policy on (3 rules, calls allowed)' : 'dvx: no tool policy',
          url,
          headers: { ...json, 'x-api-key': await token(), 'anthropic-version': '2023-06-01' },
          dispatcher: tls,
        });
      }
      tools = await toolCallProfile(contenders, quick);
    } catch (err) {
      tools = `(tool-call profile failed: ${(err as Error).message})`;
    } finally {
      for (const s of started) await s.stop();
      toolUpstream.close();
    }
  }
  await tls.close();
  await plain.close();
  await rm(dir, { recursive: true, force: true });

  const pinning = workers.some((n) => n > 1)
    ? 'load generator + mock upstream on core 0; the floor, Portkey and one-worker dvx alone on core 1; dvx with 2 workers on cores 0-1 (sharing core 0 with the load), its ratios against the floor also run on cores 0-1'
    : 'load generator + mock upstream on core 0, the proxy alone on core 1';
  process.stdout.write(
    [
      `## proxy — ${conditions(`open-loop load for ${seconds}s per rate; ${pinning} (taskset); dvx and the floor over TLS, direct and Portkey over plain HTTP; a fresh body per request (a counter in every message: no part repeats, the inspection cache at its default); added = contender minus direct at the same body and rate; ratios = added / the floor's added, and added p50 / Portkey-with-guardrail's at the same body and rate (below 1×: ahead of it)${knowsWorkers ? '' : '; this dvx has no --workers flag: one process'}`)}`,
      '',
      table(
        [
          'contender',
          'body',
          'req/s offered',
          'p50',
          'p99',
          'p50 added',
          'p99 added',
          'p50 added / floor',
          'p99 added / floor',
          'p50 added / Portkey+guardrail',
          'req/s served',
          'errors',
          'proxy RSS',
        ],
        rows,
      ),
      '',
      ...(extras
        ? [
            table(['contender', 'time to first token (SSE, p50)'], ttfts),
            '',
            memory,
            '',
            '### tool-call profile (content inspection off; closed loop, one call at a time)',
            '',
            tools,
            '',
          ]
        : []),
    ].join('\n'),
  );
}
