import http from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Agent, request } from 'undici';
import { conditions } from './conditions.ts';
import { freshBodies, llmRequestBody } from './corpus.ts';
import {
  ANTHROPIC_TEXT_REPLY,
  fullSetSnapshot,
  listenLocal,
  writeAgentIdentity,
  writeJson,
  writeServerTls,
} from './fixtures.ts';
import { formatMs, table } from './measure.ts';
import { rssOf, treeCpuSeconds, treeRss } from './proc-stats.ts';
import { pinSelf } from './processes.ts';
import {
  FLOOR_PROXY_NAME,
  PORTKEY_GUARDED_NAME,
  portkeyConfig,
  type Started,
  startFloorProxy,
  startLlmproxy,
  startPortkey,
} from './servers.ts';
import { p50p99 } from './stats.ts';
import { startToolUpstream, toolCallProfile, writeToolSnapshots, type ToolContender } from './tool-call-profile.ts';

// npm run bench -- proxy [--quick] [--workers 1,2] [--rates 500,1000,2000] [--sizes 4,64] [--seconds S]
//                        [--rounds R] [--no-extras] [--baseline DIR]
// Added latency over direct at fixed request rates, one table: the mock Anthropic upstream and this
// load generator share core 0; each single-process proxy runs alone on core 1 (taskset). Contenders:
// direct; the floor (bare node:https + undici pass-through); dvx with inspection off; dvx with the full
// set (all built-ins + 10 RE2 patterns) once per `--workers` value; @portkey-ai/gateway plain and with
// its regex guardrail. dvx with more than one worker is given both cores (0-1), so it shares core 0 with
// the load generator and the upstream; the floor is then run a second time on cores 0-1 and that
// floor is the one its ratios are taken against. Every request carries a body of its own (a counter in
// each message), so the inspection cache, left at its default, never sees a part twice.
// The machine is shared, so the rows are interleaved: every contender is started first, then for each
// body and rate the contenders take turns in R rounds (3; each round S/R seconds of load, the order
// rotated each round), so a burst of someone else's work hits them alike. A row is the median of its
// rounds, and "added" is the median over rounds of the contender's p50 (p99) minus direct's in the
// same round.
// Then time-to-first-token through each for an SSE answer, and the memory a 32 MB request costs dvx.
// Then the tool-call profile (tool-call-profile.ts): an answer with tool calls, with and without a tool
// policy. --no-extras stops after the latency table (short verification runs). --sizes picks the bodies
// (KB). --baseline DIR adds the full-set dvx (one worker, core 1) of another checkout (e.g. `git archive`
// of main, with node_modules beside it) to the same rounds: old and new measured interleaved, and a
// column of each row's CPU per served call (the proxy's user + system time over the cell, per call).

function startUpstream(): Promise<{ url: string; close: () => void }> {
  return listenLocal(
    http.createServer((req, res) => {
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
        res.writeHead(200, {
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(ANTHROPIC_TEXT_REPLY),
        });
        res.end(ANTHROPIC_TEXT_REPLY);
      });
    }),
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
  /** Mints its credentials again: a platform JWT lives under 5 minutes, a full run is longer. */
  refresh?: () => Promise<void>;
}

function option(args: string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : undefined;
}

/** The median of a few rounds' values (the mean of the middle two for an even count). */
function medianOfRounds(xs: number[]): number {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

interface RunResult {
  p50: number;
  p99: number;
  achieved: number;
  errors: number;
  /** The proxy's CPU time (user + system, it and its children) per served call, ms (NaN: direct). */
  cpuMs: number;
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
  return { ...p50p99(latencies), achieved: latencies.length / elapsed, errors, cpuMs: NaN };
}

/** openLoop, with the CPU the contender's processes spent over it, per served call. */
async function measuredLoop(
  dispatcher: Agent,
  c: Contender,
  body: () => Buffer,
  rate: number,
  seconds: number,
): Promise<RunResult> {
  const before = c.pid ? await treeCpuSeconds(c.pid) : NaN;
  const r = await openLoop(dispatcher, c, body, rate, seconds);
  const served = r.achieved * seconds;
  const cpuMs = c.pid && served > 0 ? (((await treeCpuSeconds(c.pid)) - before) * 1000) / served : NaN;
  return { ...r, cpuMs };
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
  const seconds = Number(option(args, '--seconds') ?? (quick ? 1.5 : 3));
  const rounds = Math.max(1, Number(option(args, '--rounds') ?? 3));
  // 2,000 req/s is near what one core generates with the upstream beside it even with no proxy
  // (see RESULTS.md): read its direct row before the others.
  const rates = (option(args, '--rates') ?? '500,1000,2000').split(',').map(Number);
  const workers = (option(args, '--workers') ?? '1,2').split(',').map(Number);
  const extras = !args.includes('--no-extras');
  const sizes = (option(args, '--sizes') ?? '4,64').split(',').map((kb) => Number(kb) * 1024);
  const baseline = option(args, '--baseline');
  // This process (load generator + upstream) on core 0.
  pinSelf('0');

  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-'));
  const upstream = await startUpstream();
  const upstreamUrl = upstream.url;
  const serverTls = await writeServerTls(dir);
  const { certFile, keyFile, ca } = serverTls;
  const identity = await writeAgentIdentity(dir);
  const token = identity.token;
  const secretsFile = await writeJson(dir, 'secrets.json', {
    'agent:agent-b': { 'agent:llmproxy.llm.api_key': 'sk-upstream-key', db: 's3cr3t-db-password-2026' },
  });
  const snapOff = await writeJson(dir, 'snap-off.json', fullSetSnapshot(upstreamUrl, false));
  const snapOn = await writeJson(dir, 'snap-on.json', fullSetSnapshot(upstreamUrl, true));

  const tls = new Agent({ connect: { ca: ca.certPem }, connections: 128, keepAliveTimeout: 60_000, pipelining: 1 });
  const plain = new Agent({ connections: 128, keepAliveTimeout: 60_000 });
  // `--workers` is passed always (its default is one worker per core, which would give the one-core
  // rows two); a dvx without it is started again without it and runs one process, so N > 1 cannot
  // start there.
  let knowsWorkers = true;
  /** dvx's llmproxy with the bench's TLS, keys and secrets, once it answers its health check. */
  const startDvx = async (
    name: string,
    port: number,
    snapshotFile: string,
    n = 1,
    cores = '1',
    root?: string,
  ): Promise<Started> => {
    const started = await startLlmproxy({
      root,
      name,
      port,
      certFile,
      keyFile,
      jwksFile: identity.jwksFile,
      snapshotFile,
      secretsFile,
      tls,
      flags: ['--workers', String(n)],
      cores,
    });
    if (started.dropped.some((d) => d.startsWith('--workers'))) {
      knowsWorkers = false;
      if (n !== 1) {
        await started.stop();
        throw new Error(`this dvx has no --workers flag (asked for ${n})`);
      }
    }
    return started;
  };

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
    const floor = await startFloorProxy({ dir, certFile, keyFile, upstreamUrl, cores });
    return {
      name: `${FLOOR_PROXY_NAME}${cores === '1' ? '' : ` (cores ${cores})`}`,
      url: floor.url,
      path: '/v1/messages',
      headers: { 'content-type': 'application/json' },
      pid: floor.pid,
      stop: floor.stop,
      cores,
      isFloor: true,
    };
  };
  const startDvxContender = async (inspect: boolean, n: number, root?: string): Promise<Contender> => {
    const cores = n > 1 ? '0-1' : '1';
    const port = 18480 + (inspect ? 1 : 0) + 10 * n + (root ? 5 : 0);
    const name = `${root ? `baseline ${root}: ` : ''}${inspect ? 'dvx: full inspection (built-ins + 10 RE2)' : 'dvx: inspection off'}, --workers ${n}${n > 1 ? ` (cores ${cores})` : ''}`;
    const dvx = await startDvx(name, port, inspect ? snapOn : snapOff, n, cores, root);
    const headers = {
      'content-type': 'application/json',
      'x-api-key': await token(),
      'anthropic-version': '2023-06-01',
    };
    return {
      name,
      url: dvx.url,
      path: '/v1/messages',
      headers,
      pid: dvx.pid,
      stop: dvx.stop,
      cores,
      refresh: async () => {
        headers['x-api-key'] = await token();
      },
    };
  };
  const starters: (() => Promise<Contender>)[] = [
    () => startFloor('1'),
    ...(workers.some((n) => n > 1) ? [() => startFloor('0-1')] : []),
    () => startDvxContender(false, 1),
    ...workers.map((n) => () => startDvxContender(true, n)),
    ...(baseline ? [() => startDvxContender(true, 1, baseline)] : []),
    ...[false, true].map((guard) => async (): Promise<Contender> => {
      const portkey = await startPortkey(18787 + (guard ? 1 : 0), plain);
      return {
        name: guard ? PORTKEY_GUARDED_NAME : '@portkey-ai/gateway',
        url: portkey.url,
        path: '/v1/messages',
        headers: {
          'content-type': 'application/json',
          'x-portkey-config': JSON.stringify(portkeyConfig('anthropic', upstreamUrl, guard)),
        },
        pid: portkey.pid,
        stop: portkey.stop,
        cores: '1',
      };
    }),
  ];

  const bodies = new Map(sizes.map((s) => [s, freshBodies(llmRequestBody(s, 3))]));
  const COLUMNS = 14;
  const ratio = (ours: number, floor: number | undefined) =>
    floor !== undefined && floor > 0 && Number.isFinite(ours) ? `${(Math.max(0, ours) / floor).toFixed(2)}×` : '';
  const dispatcherOf = (c: Contender) => (c.url.startsWith('https') ? tls : plain);

  // Every contender up before any is measured: the rounds below interleave them.
  const contenders: Contender[] = [direct];
  const failed: string[][] = [];
  const rows: string[][] = [];
  const ttfts: string[][] = [];
  let memory = '';
  try {
    for (const start of starters) {
      try {
        contenders.push(await start());
      } catch (err) {
        failed.push([`(could not start: ${(err as Error).message})`, ...Array<string>(COLUMNS - 1).fill('')]);
      }
    }
    for (const c of contenders)
      for (const size of sizes) await warmUp(dispatcherOf(c), c, bodies.get(size)!, quick ? 1 : 2);

    /** Per contender, body and rate: each round's result and its added p50/p99 over direct's in that round. */
    const measured = new Map<string, { r: RunResult; added50: number; added99: number }[]>();
    const keyOf = (c: Contender, size: number, rate: number) => `${c.name}|${size}:${rate}`;
    for (const size of sizes) {
      const body = bodies.get(size)!;
      for (const rate of rates) {
        for (let round = 0; round < rounds; round++) {
          // The order rotates each round: nobody always runs first, or right after the heaviest.
          const order = contenders.map((_, i) => contenders[(i + round) % contenders.length]);
          const results = new Map<Contender, RunResult>();
          for (const c of order) {
            await c.refresh?.();
            results.set(c, await measuredLoop(dispatcherOf(c), c, body, rate, seconds / rounds));
          }
          const d = results.get(direct)!;
          for (const [c, r] of results) {
            const key = keyOf(c, size, rate);
            const list = measured.get(key) ?? [];
            list.push({ r, added50: r.p50 - d.p50, added99: r.p99 - d.p99 });
            measured.set(key, list);
          }
        }
      }
    }
    /** A row's medians over its rounds. */
    const summary = (c: Contender, size: number, rate: number) => {
      const list = measured.get(keyOf(c, size, rate)) ?? [];
      return {
        p50: medianOfRounds(list.map((x) => x.r.p50)),
        p99: medianOfRounds(list.map((x) => x.r.p99)),
        added50: medianOfRounds(list.map((x) => x.added50)),
        added99: medianOfRounds(list.map((x) => x.added99)),
        achieved: medianOfRounds(list.map((x) => x.r.achieved)),
        cpuMs: medianOfRounds(list.map((x) => x.r.cpuMs)),
        errors: list.reduce((n, x) => n + x.r.errors, 0),
      };
    };
    const floorOf = (cores: string | null) => contenders.find((x) => x.isFloor && x.cores === cores);
    const guarded = contenders.find((x) => x.name === PORTKEY_GUARDED_NAME);
    for (const c of contenders) {
      const rss = await treeRss(c.pid);
      for (const size of sizes)
        for (const rate of rates) {
          const s = summary(c, size, rate);
          const floor = floorOf(c.cores);
          const f = floor ? summary(floor, size, rate) : undefined;
          const g = guarded ? summary(guarded, size, rate) : undefined;
          rows.push([
            c.name,
            `${size / 1024} KB`,
            String(rate),
            formatMs(s.p50),
            formatMs(s.p99),
            Number.isFinite(s.added50) ? formatMs(Math.max(0, s.added50)) : '',
            Number.isFinite(s.added99) ? formatMs(Math.max(0, s.added99)) : '',
            c.cores === null ? '' : ratio(s.added50, f?.added50),
            c.cores === null ? '' : ratio(s.added99, f?.added99),
            c.cores === null ? '' : ratio(s.added50, g?.added50),
            s.achieved.toFixed(0),
            Number.isFinite(s.cpuMs) ? s.cpuMs.toFixed(2) : '',
            String(s.errors),
            rss ? `${(rss / 1e6).toFixed(0)} MB` : '',
          ]);
        }
    }
    rows.push(...failed);

    if (extras) {
      for (const c of contenders) {
        await c.refresh?.();
        const first = await ttft(dispatcherOf(c), c, quick ? 20 : 100);
        // Portkey 1.15 answers a streamed call 500 under Node ("TypeError: immutable" when it adds
        // headers to the fetch Response: Portkey-AI/gateway#1389, #1550), so it has no first token.
        ttfts.push([c.name, Number.isFinite(first) ? formatMs(first) : 'no token: the stream failed']);
      }
      const dvx = contenders.find((c) => c.name.startsWith('dvx: full') && c.cores === '1');
      if (dvx) {
        const before = (await rssOf(dvx.pid)) ?? 0;
        const big = Buffer.from(
          JSON.stringify({
            model: 'claude-sonnet-4-5',
            max_tokens: 8,
            messages: [{ role: 'user', content: 'x'.repeat(32 * 1024 * 1024 - 200) }],
          }),
        );
        let peak = before;
        const sampler = setInterval(() => void rssOf(dvx.pid).then((r) => (peak = Math.max(peak, r ?? 0))), 5);
        const res = await request(`${dvx.url}${dvx.path}`, {
          method: 'POST',
          headers: dvx.headers,
          body: big,
          dispatcher: tls,
        });
        await res.body.dump();
        clearInterval(sampler);
        memory = `32 MB request through dvx (full inspection): status ${res.statusCode}, RSS ${(before / 1e6).toFixed(0)} MB → peak ${(peak / 1e6).toFixed(0)} MB (+${((peak - before) / big.length).toFixed(2)}× the body).`;
      }
    }
  } finally {
    for (const c of contenders) await c.stop();
  }
  upstream.close();

  let tools = '';
  if (extras) {
    // The tool-call profile: its own upstream (answers with tool calls), the floor and dvx before it.
    const toolUpstream = await startToolUpstream();
    const snaps = await writeToolSnapshots(dir, toolUpstream.url);
    const started: { stop: () => Promise<void> }[] = [];
    try {
      const floor = await startFloorProxy({ dir, certFile, keyFile, upstreamUrl: toolUpstream.url, tag: 'tools' });
      started.push(floor);
      const json = { 'content-type': 'application/json' };
      const contenders: ToolContender[] = [
        { name: 'direct (no proxy)', url: toolUpstream.url, headers: json, dispatcher: plain, baseline: true },
        { name: FLOOR_PROXY_NAME, url: floor.url, headers: json, dispatcher: tls },
      ];
      for (const [on, port] of [
        [false, 18482],
        [true, 18483],
      ] as const) {
        const name = on ? 'dvx: tool policy on (3 rules, calls allowed)' : 'dvx: no tool policy';
        const dvx = await startDvx(name, port, on ? snaps.on : snaps.off);
        started.push(dvx);
        contenders.push({
          name,
          url: dvx.url,
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
    ? 'load generator + mock upstream on core 0; the floor, Portkey and one-worker dvx alone on core 1; dvx with 2 workers on cores 0-1 (sharing core 0 with the load), its ratios against the floor also run on cores 0-1 (taskset)'
    : 'load generator + mock upstream on core 0, the proxy alone on core 1 (taskset)';
  process.stdout.write(
    [
      `## proxy — ${conditions(`open-loop load for ${seconds}s per rate, in ${rounds} interleaved rounds of ${+(seconds / rounds).toFixed(2)}s (every contender running; each round measures them all in turn, the order rotated; a cell is the median of its rounds); dvx and the floor over TLS, direct and Portkey over plain HTTP; a fresh body per request (a counter in every message: no part repeats, the inspection cache at its default); added = contender minus direct in the same round, median over rounds; ratios = added / the floor's added, and added p50 / Portkey-with-guardrail's at the same body and rate (below 1×: ahead of it)${knowsWorkers ? '' : '; this dvx has no --workers flag: one process'}`, pinning)}`,
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
          'proxy CPU ms / call',
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
