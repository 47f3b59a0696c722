import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type Agent, request } from 'undici';
import { BENCH_PATTERNS } from './corpus.ts';
import { NODE, pinned, ROOT, waitFor } from './processes.ts';

// The LLM proxies a bench measures, each started in a process of its own under taskset: dvx llmproxy,
// the floor (bench/floor-proxy.ts: a bare node:https + undici pass-through) and Portkey's gateway.

export interface Started {
  url: string;
  pid: number | null;
  stop: () => Promise<void>;
}

export const FLOOR_PROXY_NAME = 'floor: node:https + undici pass-through';
export const PORTKEY_GUARDED_NAME = '@portkey-ai/gateway + regex guardrail';

/** The floor over TLS to `upstreamUrl`, pinned to `cores`, once it has written its port. */
export async function startFloorProxy(options: {
  dir: string;
  certFile: string;
  keyFile: string;
  upstreamUrl: string;
  cores?: string;
  /** distinguishes the port files of several floors in one directory */
  tag?: string;
}): Promise<Started> {
  const portFile = join(options.dir, `floor-${options.tag ?? options.cores ?? '1'}.port`);
  const p = pinned(
    [NODE, join(ROOT, 'bench/floor-proxy.ts'), options.certFile, options.keyFile, options.upstreamUrl, portFile],
    { cores: options.cores },
  );
  await waitFor(async () => (await readFile(portFile, 'utf8')).length > 0, 'floor proxy', { exited: p.exited });
  return { url: `https://127.0.0.1:${Number(await readFile(portFile, 'utf8'))}`, pid: p.pid, stop: p.stop };
}

/** @portkey-ai/gateway (headless, production) on `port`, pinned to `cores`, once it answers. */
export async function startPortkey(port: number, plain: Agent, cores?: string): Promise<Started> {
  const p = pinned(
    [NODE, join(ROOT, 'node_modules/@portkey-ai/gateway/build/start-server.js'), `--port=${port}`, '--headless'],
    { env: { NODE_ENV: 'production' }, cores },
  );
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitFor(async () => (await request(`${url}/`, { dispatcher: plain })).statusCode === 200, 'portkey', {
      exited: p.exited,
    });
  } catch (err) {
    await p.stop();
    throw err;
  }
  return { url, pid: p.pid, stop: p.stop };
}

/**
 * Portkey's `x-portkey-config` for a provider at `upstreamUrl`, with its regexMatch guardrail on the
 * first bench pattern (denying on a match) when `guard`.
 */
export function portkeyConfig(provider: string, upstreamUrl: string, guard: boolean): Record<string, unknown> {
  const config: Record<string, unknown> = { provider, api_key: 'sk-upstream-key', custom_host: `${upstreamUrl}/v1` };
  if (guard)
    config.input_guardrails = [
      {
        id: 'g1',
        deny: true,
        'default.regexMatch': { rule: BENCH_PATTERNS[0].pattern.replace('(?i)', ''), not: true },
      },
    ];
  return config;
}

/**
 * Node flags for every dvx llmproxy a bench starts, from DVX_BENCH_NODE_FLAGS (split on spaces): a CPU
 * profile of each (`--cpu-prof --cpu-prof-dir=/tmp/prof`), a module of your own imported first
 * (`--import /path/hook.mjs`). Not for the numbers a bench records: a profiler slows what it watches.
 */
const LLMPROXY_NODE_FLAGS = (process.env.DVX_BENCH_NODE_FLAGS ?? '').split(' ').filter(Boolean);

export interface StartedLlmproxy extends Started {
  /** Flags this dvx did not know and was started again without (`--workers 2`, …). */
  dropped: string[];
}

/**
 * dvx llmproxy over TLS on `port` with the given files and flags, pinned to `cores`, once its health
 * check answers. A flag this dvx does not know (one that lands from another branch) stops it at parse
 * time: the bench says so on stderr and starts it again without that flag and its value, so it still
 * measures the dvx that exists; `dropped` names what was left out.
 */
export async function startLlmproxy(options: {
  name: string;
  port: number;
  certFile: string;
  keyFile: string;
  jwksFile: string;
  snapshotFile: string;
  secretsFile: string;
  /** the TLS dispatcher that trusts the bench's CA */
  tls: Agent;
  flags?: string[];
  cores?: string;
  metricsPort?: number;
  /** The dvx checkout to run (default: this one): bench/proxy.ts --baseline. */
  root?: string;
}): Promise<StartedLlmproxy> {
  let flags = options.flags ?? [];
  const dropped: string[] = [];
  const url = `https://127.0.0.1:${options.port}`;
  for (;;) {
    const p = pinned(
      [
        NODE,
        ...LLMPROXY_NODE_FLAGS,
        join(options.root ?? ROOT, 'cli/main.ts'),
        'serve',
        'llmproxy',
        '--addr',
        `127.0.0.1:${options.port}`,
        ...(options.metricsPort ? ['--metrics-addr', `127.0.0.1:${options.metricsPort}`] : []),
        '--tls-cert',
        options.certFile,
        '--tls-key',
        options.keyFile,
        '--agent-jwks',
        options.jwksFile,
        '--policy-snapshot',
        options.snapshotFile,
        '--secrets-file',
        options.secretsFile,
        '--log-level',
        'error',
        ...flags,
      ],
      { cores: options.cores },
    );
    try {
      await waitFor(
        async () => (await request(`${url}/healthz`, { dispatcher: options.tls })).statusCode === 200,
        options.name,
        { exited: p.exited },
      );
      return { url, pid: p.pid, stop: p.stop, dropped };
    } catch (err) {
      await p.stop();
      const unknown = /unknown option '(--[\w-]+)'/.exec(p.stderr());
      if (!unknown || !flags.includes(unknown[1])) throw err;
      const i = flags.indexOf(unknown[1]);
      dropped.push(flags.slice(i, i + 2).join(' '));
      flags = [...flags.slice(0, i), ...flags.slice(i + 2)];
      process.stderr.write(`bench: this dvx has no ${unknown[1]} flag; starting ${options.name} without it\n`);
    }
  }
}
