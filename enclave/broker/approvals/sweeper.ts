import type { BrokerDeps } from '../deps.ts';
import { expire } from './settle.ts';
import { dueIds, pruneEvents } from './store.ts';

// Marks pending approvals past their expiry `expired` (audited as `escalation-timeout`, announced like
// every change), every approvalSweepMs (1 s); and drops the feed's events older than 7 days, every hour. Readers never
// wait for it: a pending row past its expiry already reads as expired (view.ts). A store that does not
// answer is logged and tried again on the next tick.

export const FEED_RETENTION_MS = 7 * 24 * 3600_000;
const PRUNE_MS = 3600_000;
const BATCH = 100;

export interface Sweeper {
  /** One pass now (tests, and each tick): expires what is due; returns how many. */
  sweep(): Promise<number>;
  close(): Promise<void>;
}

export function startSweeper(deps: BrokerDeps): Sweeper {
  let running: Promise<number> | null = null;
  let closed = false;
  let lastPrune = 0;
  const pass = async (): Promise<number> => {
    let n = 0;
    for (;;) {
      const ids = await dueIds(deps.db, new Date(deps.now()), BATCH);
      for (const id of ids) {
        if (closed) return n;
        if (await expire(deps, id)) n++;
      }
      if (ids.length < BATCH) break;
    }
    if (deps.now() - lastPrune >= PRUNE_MS) {
      lastPrune = deps.now();
      const pruned = await pruneEvents(deps.db, new Date(lastPrune - FEED_RETENTION_MS));
      if (pruned > 0) deps.log.info({ pruned }, 'approval feed events past retention dropped');
    }
    return n;
  };
  const sweep = () =>
    (running ??= pass().finally(() => {
      running = null;
    }));
  const timer = setInterval(() => {
    if (closed || running) return;
    sweep().catch((err: unknown) => deps.log.warn({ err }, 'approval expiry sweep failed; retried'));
  }, deps.options.approvalSweepMs);
  timer.unref();
  return {
    sweep,
    async close() {
      closed = true;
      clearInterval(timer);
      await running?.catch(() => {});
    },
  };
}
