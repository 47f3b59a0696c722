import type { Logger } from '../../core/logger.ts';
import { LookupBusyError } from './errors.ts';
import type { Lookup } from './resolve.ts';

// Name lookups, bounded (docs/gateway.md, "Name lookups"; docs/decisions.md, "The gateway bounds its
// name lookups"). dns.lookup is getaddrinfo run in libuv's thread pool (UV_THREADPOOL_SIZE threads, 4
// by default), which the process's file system calls, zlib and crypto share. A name whose servers
// never answer holds a thread until the system resolver gives up on its own (resolv.conf's timeout and
// attempts: tens of seconds), and no deadline of ours can take it back. So:
//
//   global     at most half the pool runs lookups at once (2 of the default 4): the other half always
//              serves the rest of the process, however many names hang
//   per agent  one lookup of an agent's at a time: one agent holds at most one of those threads
//   queue      the rest wait, first come first served (an agent's waiter is skipped while its own
//              lookup runs), at most MAX_WAITING_PER_AGENT per agent and MAX_WAITING in all; past
//              that, refused at once (LookupBusyError: 503)
//   deadline   the caller's deadline (--connect-timeout) covers waiting and running; past it the caller
//              gets LOOKUP_TIMED_OUT (504), but a lookup already running keeps its slot until the
//              resolver returns, since its thread stays busy until then
//
// The system lookup is kept, rather than c-ares (dns.Resolver, no thread pool), because it answers as
// the agent's own resolver would: /etc/hosts, the search domains and ndots of resolv.conf (a
// cluster's short service names), nsswitch. c-ares' resolve* does none of that.

/** Lookups that may wait in all, and per agent, behind those running. */
export const MAX_WAITING = 128;
export const MAX_WAITING_PER_AGENT = 4;

/** The caller's deadline passed (waiting or running). */
export const LOOKUP_TIMED_OUT = Symbol('name lookup timed out');

export interface LookupRequest {
  /** Whose lookup: one at a time per key (the agent's id); null: no per-agent bound (the gateway's own). */
  agent: string | null;
  timeoutMs: number;
  /** Aborted when the caller no longer wants the answer (its client went away): a waiter leaves the queue. */
  signal?: AbortSignal;
}

export type BoundedLookup = (host: string, request: LookupRequest) => Promise<{ address: string; family: 4 | 6 }[]>;

/** The lookups the process may run at once: half of libuv's thread pool (UV_THREADPOOL_SIZE, default 4), at least 1. */
export function lookupConcurrency(env: NodeJS.ProcessEnv = process.env): number {
  const raw = Number.parseInt(env.UV_THREADPOOL_SIZE ?? '', 10);
  // libuv clamps the pool to 1..1024 and falls back to 4 on a value it cannot read.
  const pool = Number.isFinite(raw) && raw > 0 ? Math.min(raw, 1024) : 4;
  return Math.max(1, Math.floor(pool / 2));
}

interface Waiter {
  agent: string | null;
  start(): void;
  fail(err: unknown): void;
}

export class LookupLimiter {
  readonly #lookup: Lookup;
  readonly #max: number;
  readonly #log: Logger;
  #running = 0;
  /** Agents with a lookup running (still holding a thread, even when its caller has given up). */
  readonly #busy = new Set<string>();
  readonly #queue: Waiter[] = [];

  constructor(lookup: Lookup, log: Logger, max = lookupConcurrency()) {
    this.#lookup = lookup;
    this.#max = Math.max(1, max);
    this.#log = log;
  }

  /** Lookups running now (their threads busy), and waiting. */
  get running(): number {
    return this.#running;
  }
  get waiting(): number {
    return this.#queue.length;
  }

  readonly lookup: BoundedLookup = (host, request) =>
    new Promise((resolve, reject) => {
      const { agent, timeoutMs, signal } = request;
      let settled = false;
      let queued = false;
      const done = () => {
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', aborted);
        if (queued) this.#dequeue(waiter);
      };
      const fail = (err: unknown) => {
        if (settled) return;
        done();
        reject(err);
      };
      const aborted = () => fail(signal?.reason ?? new Error('the lookup is no longer wanted'));
      const timer = setTimeout(() => fail(LOOKUP_TIMED_OUT), Math.max(1, timeoutMs));
      const waiter: Waiter = {
        agent,
        fail,
        start: () => {
          queued = false;
          this.#running++;
          if (agent !== null) this.#busy.add(agent);
          const started = Date.now();
          // A lookup that throws instead of rejecting still frees its slot.
          new Promise<{ address: string; family: 4 | 6 }[]>((r) => r(this.#lookup(host))).then(
            (addresses) => {
              this.#release(agent, host, started, settled);
              if (settled) return;
              done();
              resolve(addresses);
            },
            (err: unknown) => {
              this.#release(agent, host, started, settled);
              fail(err);
            },
          );
        },
      };
      if (signal?.aborted) {
        aborted();
        return;
      }
      signal?.addEventListener('abort', aborted, { once: true });
      if (this.#free(agent)) {
        waiter.start();
        return;
      }
      const mine = agent === null ? 0 : this.#queue.filter((w) => w.agent === agent).length;
      if (this.#queue.length >= MAX_WAITING || mine >= MAX_WAITING_PER_AGENT) {
        fail(
          new LookupBusyError(
            mine >= MAX_WAITING_PER_AGENT
              ? `this agent already has ${mine} name lookups waiting behind its own`
              : `${this.#queue.length} name lookups are waiting already`,
          ),
        );
        return;
      }
      queued = true;
      this.#queue.push(waiter);
    });

  #free(agent: string | null): boolean {
    return this.#running < this.#max && (agent === null || !this.#busy.has(agent));
  }

  #dequeue(waiter: Waiter): void {
    const at = this.#queue.indexOf(waiter);
    if (at >= 0) this.#queue.splice(at, 1);
  }

  /** A lookup returned: its thread is free again; the first waiter that may run now starts. */
  #release(agent: string | null, host: string, started: number, abandoned: boolean): void {
    this.#running--;
    if (agent !== null) this.#busy.delete(agent);
    if (abandoned)
      this.#log.info(
        { host, agent_id: agent, ms: Date.now() - started },
        'a name lookup returned after its caller had given up',
      );
    while (this.#running < this.#max) {
      const next = this.#queue.findIndex((w) => this.#free(w.agent));
      if (next < 0) return;
      const [waiter] = this.#queue.splice(next, 1);
      waiter.start();
    }
  }
}
