// Resolved policy is cached per (org, agent) for 30 s (spec: Limits, "Policy cache"). Change nudges
// call invalidate() so a write takes effect before the TTL runs out.
//
// An entry also remembers the source it was resolved from (the snapshot object a call read when it
// began) and only a get from the same source hits it. Without that, a call that began before a reload
// and resolved its policy after the reload's invalidate() would put the old snapshot's policy back in
// the cache, where every later call would find it for the rest of the TTL.

export const POLICY_CACHE_TTL_MS = 30_000;

interface Entry<V> {
  value: Promise<V>;
  expires: number;
  source: object | undefined;
}

export class PolicyCache<V> {
  #entries = new Map<string, Entry<V>>();
  #ttl: number;
  #now: () => number;

  constructor(options: { ttlMs?: number; now?: () => number } = {}) {
    this.#ttl = options.ttlMs ?? POLICY_CACHE_TTL_MS;
    this.#now = options.now ?? Date.now;
  }

  static key(org: string, agent: string): string {
    return `${org}\u0000${agent}`;
  }

  /**
   * The cached value, or `load()`'s; concurrent misses share one load, and a failed load is not cached.
   * `source` is what `load` resolves from: an entry of another source is a miss.
   */
  get(org: string, agent: string, load: () => V | Promise<V>, source?: object): Promise<V> {
    const key = PolicyCache.key(org, agent);
    const now = this.#now();
    const hit = this.#entries.get(key);
    if (hit && hit.expires > now && hit.source === source) return hit.value;
    const value = Promise.resolve().then(load);
    const entry: Entry<V> = { value, expires: now + this.#ttl, source };
    this.#entries.set(key, entry);
    value.catch(() => {
      if (this.#entries.get(key) === entry) this.#entries.delete(key);
    });
    return value;
  }

  /** Drops one agent's entry, every entry of an org (agent omitted), or everything (both omitted). */
  invalidate(org?: string, agent?: string): void {
    if (org === undefined) {
      this.#entries.clear();
      return;
    }
    if (agent !== undefined) {
      this.#entries.delete(PolicyCache.key(org, agent));
      return;
    }
    const prefix = `${org}\u0000`;
    for (const key of this.#entries.keys()) if (key.startsWith(prefix)) this.#entries.delete(key);
  }

  get size(): number {
    return this.#entries.size;
  }
}
