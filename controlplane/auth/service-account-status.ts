import type { Queryable } from '../../core/sql.ts';
import { serviceAccountStatus } from '../store/service-accounts.ts';

// Whether a service account's tokens are still honoured. A disabled account's client is removed at the
// IdP, but the access tokens it already holds stay valid until they expire; the control plane refuses
// them itself. Answers are cached briefly (a disable in this process invalidates at once; another
// replica's disable is seen within TTL_MS).

const TTL_MS = 5_000;
const MAX_ENTRIES = 10_000;

export class ServiceAccountStatus {
  #db: Queryable;
  #cache = new Map<string, { disabled: boolean; until: number }>();

  constructor(db: Queryable) {
    this.#db = db;
  }

  /** `fresh`: read the store even on a cache hit (an open stream re-checking after a change). */
  async disabled(subject: string, fresh = false): Promise<boolean> {
    const hit = this.#cache.get(subject);
    if (hit && hit.until > Date.now() && !fresh) return hit.disabled;
    const disabled = (await serviceAccountStatus(this.#db, subject)) === 'disabled';
    if (this.#cache.size >= MAX_ENTRIES) this.#cache.clear();
    this.#cache.set(subject, { disabled, until: Date.now() + TTL_MS });
    return disabled;
  }

  invalidate(subject: string): void {
    this.#cache.delete(subject);
  }
}
