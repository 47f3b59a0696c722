import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { fileURLToPath } from 'node:url';

// Starting, pinning, waiting for and stopping the processes a benchmark measures. Every bench that
// runs something in a process of its own uses these: the process under test alone on core 1
// (`taskset -c 1`), the bench itself (load generator, mock upstream) on core 0.

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const NODE = process.execPath;

/** Pins this process (the load generator and the mock upstreams it serves) to `cores`. */
export function pinSelf(cores = '0'): void {
  spawn('taskset', ['-p', '-c', cores, String(process.pid)], { stdio: 'ignore' });
}

export interface Pinned {
  child: ChildProcess;
  /** The process under test: `taskset` execs it, so it keeps taskset's pid. */
  pid: number | null;
  /** What it wrote on stderr so far (passed through as well), to tell why it stopped. */
  stderr: () => string;
  /** Why it is gone (`code 1: …`), or null while it runs. */
  exited: () => string | null;
  stop: () => Promise<void>;
}

/** `args` under `taskset -c cores` (core 1 unless told), stderr passed through and kept. */
export function pinned(args: string[], options: { cores?: string; env?: Record<string, string> } = {}): Pinned {
  const child = spawn('taskset', ['-c', options.cores ?? '1', ...args], {
    env: { ...process.env, ...options.env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr?.on('data', (c: Buffer) => {
    if (err.length < 64 * 1024) err += c;
    process.stderr.write(c);
  });
  return {
    child,
    pid: child.pid ?? null,
    stderr: () => err,
    exited: () =>
      child.exitCode !== null || child.signalCode !== null
        ? `code ${child.exitCode ?? child.signalCode}: ${err.trim().slice(0, 300)}`
        : null,
    stop: () => stopChild(child),
  };
}

/** SIGTERM, then SIGKILL after 5 s; resolves once it has exited. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const done = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), 5000);
  await done;
  clearTimeout(t);
}

/** Polls `check` every 100 ms until it holds; fails when `exited` says the process is gone, or after `ms`. */
export async function waitFor(
  check: () => Promise<boolean>,
  what: string,
  options: { ms?: number; exited?: () => string | null } = {},
): Promise<void> {
  const end = Date.now() + (options.ms ?? 30_000);
  while (Date.now() < end) {
    const gone = options.exited?.();
    if (gone !== null && gone !== undefined) throw new Error(`${what} exited: ${gone}`);
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** Resolves once 127.0.0.1:port accepts a TCP connection. */
export function accepts(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

/** A port nobody listens on now (the kernel's pick). */
export function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}
