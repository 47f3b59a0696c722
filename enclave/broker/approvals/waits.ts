import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import type { BrokerDeps } from '../deps.ts';
import { getApproval } from './store.ts';
import { approvalView, type ApprovalRow, type ApprovalView } from './view.ts';

// The satellites' long-polls (GET /v1/satellite/approvals/{id}?wait=SECONDS): a wait answers as soon as
// the approval is no longer pending (woken by the bus, or at its expiry), or when the wait ends, or when
// the broker shuts down, or when the caller left. At most MAX_WAITERS wait at once; past that a wait is
// refused with 503 and Retry-After (llmproxy asks again). A wait also re-reads the store every
// RECHECK_MS: a change made by another broker on the same store reaches it without the bus.

export const MAX_WAIT_SECONDS = 30;
export const MAX_WAITERS = 1024;
const RECHECK_MS = 5000;

export class ApprovalWaits {
  readonly #deps: BrokerDeps;
  readonly #waiting = new Map<string, Set<() => void>>();
  #count = 0;
  #closed = false;
  readonly #onChange: (c: { id: string }) => void;

  constructor(deps: BrokerDeps) {
    this.#deps = deps;
    this.#onChange = (c) => {
      for (const wake of this.#waiting.get(c.id) ?? []) wake();
    };
    deps.bus.on('approvals', this.#onChange);
  }

  /** How many waits are open now. */
  get size(): number {
    return this.#count;
  }

  /**
   * The approval `id` once it is no longer pending, or as it is after `ms` (or at shutdown, or when
   * `gone` fires); null when there is no such approval.
   */
  async wait(id: string, ms: number, gone: AbortSignal): Promise<ApprovalView | null> {
    const deps = this.#deps;
    const read = async (): Promise<ApprovalRow | null> => getApproval(deps.db, id);
    let row = await read();
    if (!row || ms <= 0 || this.#closed || approvalView(row, deps.now()).status !== 'pending')
      return row && approvalView(row, deps.now());
    if (this.#count >= MAX_WAITERS)
      throw new ApiError(PROBLEMS.busy, `${MAX_WAITERS} approval waits are open: ask again shortly`);
    this.#count++;
    let set = this.#waiting.get(id);
    if (!set) this.#waiting.set(id, (set = new Set()));
    const waiters = set;
    try {
      const end = Date.now() + ms;
      while (!this.#closed && !gone.aborted) {
        const view = approvalView(row!, deps.now());
        if (view.status !== 'pending') return view;
        const left = end - Date.now();
        if (left <= 0) return view;
        // Until a change is announced, the approval is due, a re-check, the wait's end or the caller leaves.
        const due = new Date(row!.expires_at).getTime() - deps.now();
        await new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(timer);
            waiters.delete(done);
            gone.removeEventListener('abort', done);
            resolve();
          };
          const timer = setTimeout(done, Math.max(0, Math.min(left, RECHECK_MS, due + 5)));
          waiters.add(done);
          gone.addEventListener('abort', done);
        });
        row = (await read()) ?? row;
      }
      return approvalView(row!, deps.now());
    } finally {
      this.#count--;
      if (waiters.size === 0 && this.#waiting.get(id) === waiters) this.#waiting.delete(id);
    }
  }

  /** Answers every open wait now (shutdown). */
  close(): void {
    this.#closed = true;
    this.#deps.bus.off('approvals', this.#onChange);
    for (const set of this.#waiting.values()) for (const wake of [...set]) wake();
  }
}
