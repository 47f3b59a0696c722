import type { Piscina } from 'piscina';

// The inspection pool, started on its first task. A Piscina starts its minimum of threads when it is
// constructed; each thread is a V8 isolate with the inspectors loaded (tens of MB of RSS). A gateway
// that only relays blind tunnels, or a proxy whose bodies all stay under the inline threshold, never
// pools a body and so never pays for one (P11: an idle gateway sat above 200 MB RSS).
//
// Why not `minThreads: 0`: tried, and with it test/pipeline/engine.test.ts ("the deadline runs from when
// a worker starts the scan") failed: a scan queued behind hung ones on a one-thread pool waited out its
// queue bound and failed open (queue_timeout). Once started, this pool keeps Piscina's minimum of one.

/** What the engine uses of its pool. */
export type InspectionPool = Pick<Piscina, 'queueSize' | 'run' | 'destroy'>;

export function lazyPool(create: () => Piscina): InspectionPool {
  let pool: Piscina | null = null;
  const started = () => (pool ??= create());
  return {
    get queueSize() {
      return pool?.queueSize ?? 0;
    },
    run: (task, options) => started().run(task, options),
    destroy: async () => {
      await pool?.destroy();
    },
  };
}
