import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../core/logger.ts';
import { createRegistry } from '../core/metrics.ts';
import { WalDirBusyError } from './errors.ts';
import type { AuditTable } from './sink.ts';
import { openStore, type AuditStore } from './store.ts';
import { TABLES, WalSink } from './wal-sink.ts';

// The spools under one --audit-wal-dir when a component runs several processes (`--workers N`):
//
//   <dir>/<table>/…            the spool of a one-process run (--workers 1), as it always was
//   <dir>/worker-<k>/<table>/… the spool of the worker in slot k (core/worker-cluster.ts)
//
// A spool with no live writer (N shrank, a rolling restart moved a slot, the run switched between one
// and several processes) is an orphan: its records are durable but nobody ships them. The orphan
// drainer finds them, takes each one's lock (so no worker can start on it meanwhile), ships it to the
// store and lets it go. `dvx wal` reads every spool.

export const WORKER_DIR = /^worker-(\d+)$/;

export interface Spool {
  /** '.' for the top-level spool, `worker-<k>` for a worker's. */
  name: string;
  dir: string;
  /** The worker slot, or null for the top-level spool. */
  slot: number | null;
}

export const workerWalDir = (root: string, slot: number): string => join(root, `worker-${slot}`);

async function tableDirs(dir: string): Promise<AuditTable[]> {
  const entries = await readdir(dir).catch(() => [] as string[]);
  return TABLES.filter((t) => entries.includes(t));
}

/** Every spool under `root` that holds at least one table: the top-level one first, then by slot. */
export async function listSpools(root: string): Promise<Spool[]> {
  const entries = await readdir(root).catch(() => [] as string[]);
  const spools: Spool[] = [];
  if ((await tableDirs(root)).length > 0) spools.push({ name: '.', dir: root, slot: null });
  const workers = entries
    .map((e) => WORKER_DIR.exec(e))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({ name: m[0], dir: join(root, m[0]), slot: Number(m[1]) }))
    .sort((a, b) => a.slot - b.slot);
  for (const w of workers) if ((await tableDirs(w.dir)).length > 0) spools.push(w);
  return spools;
}

export interface OrphanDrainerOptions {
  root: string;
  dsn: string;
  log: Logger;
  maxBytes?: number;
  /** A spool with a live writer (or one this process writes itself): never drained. */
  live: (spool: Spool) => boolean;
  /** How often the directory is looked at again for spools left behind. */
  intervalMs?: number;
  /** How long one wait for a spool to be shipped lasts before it is tried again (store down). */
  shipWaitMs?: number;
}

/** Ships spools that no live process writes, so they are never stranded (see above). */
export class OrphanDrainer {
  #o: OrphanDrainerOptions;
  #draining = new Map<string, Promise<void>>();
  #drainingSlots = new Set<number>();
  /** Spools shipped to their end since they were last live: nothing new can arrive in them. */
  #done = new Set<string>();
  /** One store for every drain, opened at the first (a promise: drains start together). */
  #store: Promise<AuditStore> | null = null;
  #timer: NodeJS.Timeout | null = null;
  #stopped = false;
  #scanning: Promise<void> | null = null;

  constructor(o: OrphanDrainerOptions) {
    this.#o = o;
  }

  start(): void {
    this.scan();
    this.#timer = setInterval(() => this.scan(), this.#o.intervalMs ?? 5000);
    this.#timer.unref();
  }

  /** Slots being drained now: the supervisor hands them to no new worker. */
  draining(slot: number): boolean {
    return this.#drainingSlots.has(slot);
  }

  /** Looks for orphans now (also called on a timer, and by the supervisor after a worker exits). */
  scan(): void {
    this.#scanning ??= this.#scan().finally(() => {
      this.#scanning = null;
    });
  }

  async #scan(): Promise<void> {
    if (this.#stopped) return;
    let spools: Spool[];
    try {
      spools = await listSpools(this.#o.root);
    } catch (err) {
      this.#o.log.warn({ err, dir: this.#o.root }, 'audit spools: cannot list');
      return;
    }
    for (const spool of spools) {
      if (this.#o.live(spool)) {
        this.#done.delete(spool.dir);
        continue;
      }
      if (this.#draining.has(spool.dir) || this.#done.has(spool.dir)) continue;
      // Marked before anything async: from here on no worker is given this slot.
      if (spool.slot !== null) this.#drainingSlots.add(spool.slot);
      const drain = this.#drain(spool).finally(() => {
        this.#draining.delete(spool.dir);
        if (spool.slot !== null) this.#drainingSlots.delete(spool.slot);
      });
      this.#draining.set(spool.dir, drain);
    }
  }

  async #openStore(): Promise<AuditStore> {
    this.#store ??= openStore(this.#o.dsn).catch((err: unknown) => {
      this.#store = null; // tried again by the next drain
      throw err;
    });
    const store = await this.#store;
    // Shared by every drain; closed once, by stop().
    return {
      kind: store.kind,
      ensureSchema: () => store.ensureSchema(),
      insert: (table, rows) => store.insert(table, rows),
      readEvents: (q) => store.readEvents(q),
      readLlm: (q) => store.readLlm(q),
      eraseOrg: (org) => store.eraseOrg(org),
      close: async () => {},
    };
  }

  async #drain(spool: Spool): Promise<void> {
    if (this.#o.dsn.startsWith('pglite:')) {
      // PGlite is one process's database, already open in the component: a second instance would
      // corrupt it. The records stay on disk; they ship once a run with a server store picks them up.
      this.#o.log.warn({ spool: spool.dir }, 'audit spool without a writer kept: a pglite store is not shared');
      this.#done.add(spool.dir);
      return;
    }
    let sink: WalSink;
    try {
      sink = await WalSink.open({
        dir: spool.dir,
        dsn: this.#o.dsn,
        store: await this.#openStore(),
        maxBytes: this.#o.maxBytes,
        log: this.#o.log,
        // Its own registry: the component's already has the WAL metrics of its own sink.
        registry: createRegistry(),
        tables: await tableDirs(spool.dir),
      });
    } catch (err) {
      if (!(err instanceof WalDirBusyError))
        this.#o.log.warn({ err, spool: spool.dir }, 'audit spool without a writer: cannot open it; retrying');
      return; // a process took it meanwhile (it ships it), or it is tried again at the next scan
    }
    this.#o.log.info({ spool: spool.name }, 'shipping an audit spool left without a writer');
    let lastWarn = Date.now();
    try {
      // Short waits, so a stop is not held up by a store that is away.
      while (!this.#stopped) {
        try {
          await sink.shipped(1000);
          this.#done.add(spool.dir);
          this.#o.log.info({ spool: spool.name }, 'audit spool left without a writer: shipped');
          return;
        } catch (err) {
          if (Date.now() - lastWarn < (this.#o.shipWaitMs ?? 30_000)) continue;
          lastWarn = Date.now();
          this.#o.log.warn({ err, spool: spool.name }, 'audit spool left without a writer: not shipped yet');
        }
      }
    } finally {
      await sink.close();
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    await this.#scanning;
    await Promise.allSettled([...this.#draining.values()]);
    await this.#store?.then(
      (store) => store.close(),
      () => {}, // never opened: nothing to close
    );
  }
}
