import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry, Registry } from 'prom-client';
import { WorkerStartError } from './errors.ts';
import type { Logger } from './logger.ts';
import { counter, gauge } from './metrics.ts';

// `--workers N`: N processes share one listening socket (node:cluster; the primary accepts and hands
// connections round-robin). The primary serves nothing itself: it forks the workers, replaces one that
// dies (with backoff), rolls them one at a time on `restart()` (SIGHUP in the CLI), stops them all on
// `stop()`, and answers the metrics endpoint with every worker's registry summed.
//
//   primary ──fork(slot k)──▶ worker ──"ready"──▶ primary
//      │ restart: fork the replacement on a free slot, wait for "ready", then "stop" the old one
//      │ metrics: "metrics?" to every worker ──▶ their registries as JSON ──▶ summed
//      └ gone (SIGKILL): the workers' channel closes and node:cluster exits them at once
//
// Each worker holds a slot (1, 2, …), passed in DVX_WORKER_SLOT; the component keys per-worker state on
// it (its WAL directory). A slot is never given to two live workers; a replacement takes the lowest free
// slot, so a crashed worker's successor reuses its slot and a rolling restart uses at most N + 1.

export const WORKER_SLOT_ENV = 'DVX_WORKER_SLOT';

/** One registry's metrics as JSON (Registry.getMetricsAsJSON). */
type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

type ToWorker = { dvx: 'stop' } | { dvx: 'metrics'; id: number };
type ToPrimary = { dvx: 'ready' } | { dvx: 'metrics'; id: number; metrics: MetricsJson };

/** This process's slot when it is a cluster worker; null in a primary or a lone process. */
export function workerSlot(): number | null {
  if (!cluster.isWorker) return null;
  const slot = Number(process.env[WORKER_SLOT_ENV]);
  return Number.isInteger(slot) && slot > 0 ? slot : null;
}

export interface WorkerClusterOptions {
  workers: number;
  log: Logger;
  /** The primary's own registry: supervisor metrics go there, and it is summed with the workers'. */
  registry: Registry;
  /** Delay before a crashed worker is replaced: base, doubling per recent crash, up to max. */
  backoffMs?: { base: number; max: number };
  /** How long a worker's answer to a metrics scrape is awaited; a silent worker is left out. */
  metricsTimeoutMs?: number;
  /** A slot the component keeps for itself for now (a WAL directory it is shipping): not handed out. */
  slotBusy?: (slot: number) => boolean;
}

interface Member {
  slot: number;
  worker: Worker;
  ready: boolean;
  /** Asked to stop by us: its exit is not a crash. */
  retiring: boolean;
  exited: Promise<{ code: number | null; signal: string | null }>;
}

export class WorkerCluster {
  #o: Required<Omit<WorkerClusterOptions, 'slotBusy'>> & Pick<WorkerClusterOptions, 'slotBusy'>;
  #members = new Set<Member>();
  #stopping = false;
  #crashes = 0;
  #lastCrash = 0;
  #replacing = new Set<NodeJS.Timeout>();
  #rolling: Promise<void> | null = null;
  #rollAgain = false;
  #metricsSeq = 0;
  #metricsWaiters = new Map<number, { want: number; got: MetricsJson[]; done: () => void }>();
  #restarts;
  #live;

  private constructor(o: WorkerClusterOptions) {
    this.#o = { backoffMs: { base: 200, max: 30_000 }, metricsTimeoutMs: 2000, ...o };
    this.#restarts = counter(o.registry, 'dvx_worker_restarts_total', 'Workers started again, by why', ['reason']);
    this.#live = gauge(o.registry, 'dvx_workers', 'Worker processes that are ready');
  }

  /** Forks the workers and resolves once all are ready; WorkerStartError when one dies first. */
  static async start(o: WorkerClusterOptions): Promise<WorkerCluster> {
    const c = new WorkerCluster(o);
    const first = Array.from({ length: o.workers }, () => c.#fork());
    try {
      await Promise.all(first.map((m) => c.#whenReady(m)));
    } catch (err) {
      await c.stop();
      throw err;
    }
    return c;
  }

  /** Slots of the workers alive now (ready or starting). */
  slots(): Set<number> {
    return new Set([...this.#members].map((m) => m.slot));
  }

  #freeSlot(): number {
    const taken = this.slots();
    for (let slot = 1; ; slot++) if (!taken.has(slot) && !this.#o.slotBusy?.(slot)) return slot;
  }

  #fork(slot = this.#freeSlot()): Member {
    const worker = cluster.fork({ [WORKER_SLOT_ENV]: String(slot) });
    const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
      worker.once('exit', (code, signal) => resolve({ code, signal })),
    );
    const member: Member = { slot, worker, ready: false, retiring: false, exited };
    this.#members.add(member);
    worker.on('message', (msg: ToPrimary) => this.#onMessage(member, msg));
    // A worker whose IPC breaks while it is alive cannot be drained or scraped: its exit follows.
    worker.on('error', (err) =>
      this.#o.log.warn({ err, worker: slot, pid: worker.process.pid }, 'worker channel error'),
    );
    void exited.then(({ code, signal }) => this.#onExit(member, code, signal));
    this.#o.log.info({ worker: slot, pid: worker.process.pid }, 'worker started');
    return member;
  }

  #onMessage(member: Member, msg: ToPrimary): void {
    if (msg?.dvx === 'ready') {
      member.ready = true;
      this.#live.set(this.#readyCount());
      member.worker.emit('dvx-ready');
    } else if (msg?.dvx === 'metrics') {
      const waiter = this.#metricsWaiters.get(msg.id);
      if (!waiter) return;
      waiter.got.push(msg.metrics);
      if (waiter.got.length >= waiter.want) waiter.done();
    }
  }

  #readyCount(): number {
    return [...this.#members].filter((m) => m.ready && !m.retiring).length;
  }

  #whenReady(member: Member): Promise<void> {
    if (member.ready) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onReady = () => {
        member.worker.off('exit', onExit);
        resolve();
      };
      const onExit = (code: number | null, signal: string | null) => {
        member.worker.off('dvx-ready', onReady);
        reject(
          new WorkerStartError(
            `worker ${member.slot} exited before it was ready (${signal ?? `exit code ${code}`})`,
            code && code > 0 ? code : 1,
          ),
        );
      };
      member.worker.once('dvx-ready', onReady);
      member.worker.once('exit', onExit);
    });
  }

  #onExit(member: Member, code: number | null, signal: string | null): void {
    this.#members.delete(member);
    this.#live.set(this.#readyCount());
    if (member.retiring || this.#stopping) {
      this.#o.log.info({ worker: member.slot, pid: member.worker.process.pid, code, signal }, 'worker stopped');
      return;
    }
    if (!member.ready) return; // a start that failed: whoever waited for it (start, restart) reports it
    const now = Date.now();
    // Crashes close together back off; a worker that ran a minute since the last one starts the count again.
    this.#crashes = now - this.#lastCrash > 60_000 ? 1 : this.#crashes + 1;
    this.#lastCrash = now;
    const { base, max } = this.#o.backoffMs;
    const delay = Math.min(max, base * 2 ** (this.#crashes - 1));
    this.#o.log.error(
      { worker: member.slot, pid: member.worker.process.pid, code, signal, restart_in_ms: delay },
      'worker exited unexpectedly; replacing it',
    );
    const timer = setTimeout(() => {
      this.#replacing.delete(timer);
      if (this.#stopping) return;
      this.#restarts.inc({ reason: 'crash' });
      const next = this.#fork();
      this.#whenReady(next).catch((err: Error) => {
        // The replacement died before it was ready: count it as a crash and go round again.
        this.#o.log.error({ err, worker: next.slot }, 'replacement worker failed to start');
        this.#onExit({ ...next, ready: true }, null, null);
      });
    }, delay);
    this.#replacing.add(timer);
  }

  /**
   * Rolling restart: for each worker, fork its replacement, wait until it is ready, then drain the old
   * one (it stops accepting; its calls in flight and their records finish). One at a time, so N - 1
   * workers serve throughout. A restart asked for while one runs runs once more after it.
   */
  restart(): Promise<void> {
    if (this.#rolling) {
      this.#rollAgain = true;
      return this.#rolling;
    }
    this.#rolling = (async () => {
      do {
        this.#rollAgain = false;
        await this.#roll();
      } while (this.#rollAgain && !this.#stopping);
    })().finally(() => {
      this.#rolling = null;
    });
    return this.#rolling;
  }

  async #roll(): Promise<void> {
    const old = [...this.#members].filter((m) => !m.retiring);
    this.#o.log.info({ workers: old.length }, 'rolling restart');
    for (const member of old) {
      if (this.#stopping) return;
      if (!this.#members.has(member)) continue; // crashed meanwhile: already being replaced
      const next = this.#fork();
      try {
        await this.#whenReady(next);
      } catch (err) {
        this.#o.log.error({ err, worker: next.slot }, 'rolling restart stopped: a replacement failed to start');
        return;
      }
      this.#restarts.inc({ reason: 'rolling' });
      await this.#retire(member);
    }
    this.#o.log.info({ workers: this.#readyCount() }, 'rolling restart done');
  }

  async #retire(member: Member): Promise<void> {
    member.retiring = true;
    this.#live.set(this.#readyCount());
    this.#send(member, { dvx: 'stop' });
    await member.exited;
  }

  #send(member: Member, msg: ToWorker): void {
    try {
      if (member.worker.isConnected()) member.worker.send(msg);
      else member.worker.process.kill('SIGTERM');
    } catch {
      // The channel closed between the check and the send: the worker is on its way out.
    }
  }

  /** Graceful stop of every worker (each finishes its calls and records); resolves when all exited. */
  async stop(): Promise<void> {
    this.#stopping = true;
    for (const t of this.#replacing) clearTimeout(t);
    this.#replacing.clear();
    const members = [...this.#members];
    for (const m of members) {
      m.retiring = true;
      // One still starting listens for no message yet: SIGTERM (it has served nothing, so its default
      // action, exit, loses nothing; once it serves, its handler closes it gracefully).
      if (m.ready) this.#send(m, { dvx: 'stop' });
      else m.worker.process.kill('SIGTERM');
    }
    await Promise.all(members.map((m) => m.exited));
  }

  /** The workers' registries and the primary's own, summed (prom-client's cluster aggregation). */
  async metrics(): Promise<Registry> {
    const members = [...this.#members].filter((m) => m.ready && m.worker.isConnected());
    const id = ++this.#metricsSeq;
    const got: MetricsJson[] = [];
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, this.#o.metricsTimeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      this.#metricsWaiters.set(id, { want: members.length, got, done });
      if (members.length === 0) done();
      for (const m of members) this.#send(m, { dvx: 'metrics', id });
    });
    this.#metricsWaiters.delete(id);
    if (got.length < members.length)
      this.#o.log.warn({ answered: got.length, workers: members.length }, 'metrics: a worker did not answer in time');
    const own = await this.#o.registry.getMetricsAsJSON();
    return AggregatorRegistry.aggregate([own, ...got]);
  }
}

/**
 * The registry the primary's metrics listener serves: its own metrics (the listener's, the supervisor's)
 * plus every worker's, summed at each scrape.
 */
export class ClusterRegistry extends Registry {
  #cluster: () => WorkerCluster | null;
  constructor(cluster: () => WorkerCluster | null) {
    super();
    this.#cluster = cluster;
  }
  override async metrics(): Promise<string> {
    const c = this.#cluster();
    return c ? (await c.metrics()).metrics() : super.metrics();
  }
}

/**
 * Lets go of the primary so the process can end on its own, with its own exit code: node:cluster exits a
 * worker with code 0 at once when its channel closes unless the worker itself asked for it
 * (`cluster.worker.disconnect()`).
 */
export function leaveCluster(): void {
  if (cluster.worker?.isConnected()) cluster.worker.disconnect();
}

/**
 * The worker's side: tell the primary it is ready, answer metrics scrapes from `registry`, and stop
 * gracefully (`close`) when the primary asks or on SIGTERM/SIGINT. Resolves after `close`, with the IPC
 * channel let go so the process can exit. A primary that is gone (SIGKILLed) closes the channel, and
 * node:cluster then exits the worker at once (code 0): nothing keeps serving without a supervisor or
 * holds the port; calls in flight are cut, and every answered call's record is already durable.
 */
export function serveAsWorker(o: { registry: Registry; close: () => Promise<void>; log: Logger }): Promise<void> {
  return new Promise<void>((done) => {
    let closing = false;
    const stop = (why: string) => {
      if (closing) return;
      closing = true;
      o.log.info({ why }, 'worker stopping');
      o.close()
        .catch((err: Error) => o.log.error({ err }, 'worker close failed'))
        .finally(() => {
          process.off('message', onMessage);
          leaveCluster();
          done();
        });
    };
    const onMessage = (msg: ToWorker) => {
      if (msg?.dvx === 'stop') stop('asked by the primary');
      else if (msg?.dvx === 'metrics') {
        o.registry.getMetricsAsJSON().then(
          (metrics) => {
            if (process.connected) process.send?.({ dvx: 'metrics', id: msg.id, metrics } satisfies ToPrimary);
          },
          (err: Error) => o.log.warn({ err }, 'metrics: registry failed'),
        );
      }
    };
    process.on('message', onMessage);
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
    // Signals after the first: the stop under way is not interrupted.
    process.on('SIGTERM', () => {});
    process.on('SIGINT', () => {});
    if (process.connected) process.send?.({ dvx: 'ready' } satisfies ToPrimary);
    else stop('primary gone');
  });
}
