import { hash } from 'node:crypto';
import type { Finding } from './finding.ts';

// What the built-in inspectors found in a conversation part (conversation-parts.ts), kept so that a
// part the agent resends is not scanned again (docs/decisions.md, "The per-part inspection cache").
//
//   key = sha256(scan context) ‖ sha256(part bytes)
//         scan context: phase, policy version (itself a sha256 of the policy), the agent's secret
//         values (a sha256 of them), the inspectors that ran
//
// A policy change, a new or changed secret value, or another set of inspectors gives another key, so
// an old entry is never read again (it ages out). The hash is cryptographic on purpose: an attacker
// who could make a new part collide with a clean cached one would have it pass unscanned. Only results
// without failures are stored (the engine's part): a fail-open is never reused as a pass.
//
// Size-capped LRU: a Map for look-ups and a doubly linked list for the order; a hit moves the entry to
// the back, eviction takes from the front. (Not the Map's own insertion order: a hit there is a delete
// and a set, and each delete leaves a hole at the front that the next eviction's iterator walks over
// until the table is rebuilt: 65 µs per stored entry at 100k entries, measured.) The size counts each
// entry's key, its findings' strings, and a fixed overhead. A part whose findings an agent's next body
// inherits without a look-up (resent-parts.ts) is touched by those findings (`touch`): it moves to the
// back as a hit would, so an active conversation's parts are not the first evicted.

/** What one entry costs beyond its key and findings: the Map slot, the array, the object headers and list links (measured: ~270 bytes an entry in all, key included, against ~300 counted). */
const ENTRY_OVERHEAD = 112;
const FINDING_OVERHEAD = 64;

export const DEFAULT_CACHE_BYTES = 64 * 1024 * 1024;
/** Contexts remembered (policy versions × secret sets × phases in use); past it the memo starts over. */
const MAX_CONTEXTS = 1024;

interface Entry {
  key: string;
  findings: readonly Finding[];
  size: number;
  /** Toward the least recently used (null: this is the oldest). */
  older: Entry | null;
  /** Toward the most recently used (null: this is the newest). */
  newer: Entry | null;
  /** Still in the cache (false once evicted or replaced). */
  live: boolean;
}

export interface PartCacheOptions {
  maxBytes: number;
  onEvict?: (count: number) => void;
}

export class PartCache {
  #entries = new Map<string, Entry>();
  #oldest: Entry | null = null;
  #newest: Entry | null = null;
  #bytes = 0;
  #max: number;
  #onEvict: ((count: number) => void) | undefined;
  #secretPrints = new WeakMap<readonly string[], string>();
  /** Contexts already made, by their inputs (two sha256 and a JSON.stringify saved per inspection). */
  #contexts = new Map<string, string>();
  /** Contexts by what determines them, compared by identity (`scanContext`): no string built per call. */
  #byPlan = new WeakMap<object, WeakMap<readonly string[], Map<string, Map<string, string>>>>();
  /** Each entry by its findings array (a copy of its own, `set`): what `touch` is handed. */
  #byFindings = new WeakMap<readonly Finding[], Entry>();

  constructor(options: PartCacheOptions) {
    this.#max = options.maxBytes;
    this.#onEvict = options.onEvict;
  }

  /** Bytes held (keys, findings, overhead). */
  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#entries.size;
  }

  /**
   * The scan context's part of every key, made once per inspection. The secret values' fingerprint is
   * remembered per frozen array (the proxy hands the same frozen array to every call of an agent until
   * its secrets change, proxy/llm/secrets-file.ts); an array that could change is hashed each time.
   */
  context(phase: string, policyVersion: string, secrets: readonly string[], inspectors: readonly string[]): string {
    let print = this.#secretPrints.get(secrets);
    if (print === undefined) {
      print = hash('sha256', JSON.stringify(secrets), 'base64');
      if (Object.isFrozen(secrets)) this.#secretPrints.set(secrets, print);
    }
    // The memo's key holds every input whole (no sha256 of its own): the same inputs, the same context.
    const memo = JSON.stringify([phase, policyVersion, print, inspectors]);
    let context = this.#contexts.get(memo);
    if (context === undefined) {
      context = hash('sha256', memo, 'base64');
      if (this.#contexts.size >= MAX_CONTEXTS) this.#contexts.clear();
      this.#contexts.set(memo, context);
    }
    return context;
  }

  /**
   * `context()` for a compiled plan's inspectors, remembered by identity: the plan (compiled once per
   * policy version, immutable, its version checked), the frozen secrets array, then the variant
   * (whether model restriction runs) and the phase. The same inputs give the same context, so this is
   * `context()` without its JSON.stringify and the inspectors' list per call, and without building a
   * key string. An array that could change is not remembered (`context()` hashes it each time).
   */
  scanContext(
    plan: { readonly version: string },
    variant: string,
    phase: string,
    policyVersion: string,
    secrets: readonly string[],
    inspectors: () => readonly string[],
  ): string {
    if (plan.version !== policyVersion || !Object.isFrozen(secrets))
      return this.context(phase, policyVersion, secrets, inspectors());
    let bySecrets = this.#byPlan.get(plan);
    if (bySecrets === undefined) {
      bySecrets = new WeakMap();
      this.#byPlan.set(plan, bySecrets);
    }
    let variants = bySecrets.get(secrets);
    if (variants === undefined) {
      variants = new Map();
      bySecrets.set(secrets, variants);
    }
    let phases = variants.get(variant);
    if (phases === undefined) {
      phases = new Map();
      variants.set(variant, phases);
    }
    let context = phases.get(phase);
    if (context === undefined) {
      context = this.context(phase, policyVersion, secrets, inspectors());
      phases.set(phase, context);
    }
    return context;
  }

  /** The key of a part's bytes under a context (`context()`). */
  key(context: string, part: Uint8Array): string {
    return context + hash('sha256', part, 'base64');
  }

  get(key: string): readonly Finding[] | undefined {
    const entry = this.#entries.get(key);
    if (entry === undefined) return undefined;
    this.#unlink(entry);
    this.#append(entry);
    return entry.findings;
  }

  /**
   * Marks the entry whose findings these are (as `get` or `set` returned them) as just used, as a hit
   * would; true when it is still held. False: evicted since (or never this cache's), so the caller may
   * store the findings again.
   */
  touch(findings: readonly Finding[]): boolean {
    const entry = this.#byFindings.get(findings);
    if (entry === undefined || !entry.live) return false;
    this.#unlink(entry);
    this.#append(entry);
    return true;
  }

  /** Stores a part's findings (a frozen copy, also returned); undefined: too large to store. */
  set(key: string, findings: readonly Finding[]): readonly Finding[] | undefined {
    const size = entrySize(key, findings);
    if (size > this.#max) return undefined;
    // A copy of each finding, frozen: what the caller does with its outcome cannot change the cache.
    findings = Object.freeze(findings.map((f) => Object.freeze({ ...f })));
    const old = this.#entries.get(key);
    if (old !== undefined) {
      this.#unlink(old);
      this.#bytes -= old.size;
      old.live = false;
    }
    const entry: Entry = { key, findings, size, older: null, newer: null, live: true };
    this.#entries.set(key, entry);
    this.#byFindings.set(findings, entry);
    this.#append(entry);
    this.#bytes += size;
    let evicted = 0;
    while (this.#bytes > this.#max && this.#oldest !== null) {
      const oldest = this.#oldest;
      this.#unlink(oldest);
      this.#entries.delete(oldest.key);
      this.#bytes -= oldest.size;
      oldest.live = false;
      evicted++;
    }
    if (evicted > 0) this.#onEvict?.(evicted);
    return findings;
  }

  #unlink(entry: Entry): void {
    if (entry.older === null) this.#oldest = entry.newer;
    else entry.older.newer = entry.newer;
    if (entry.newer === null) this.#newest = entry.older;
    else entry.newer.older = entry.older;
    entry.older = entry.newer = null;
  }

  #append(entry: Entry): void {
    entry.older = this.#newest;
    if (this.#newest === null) this.#oldest = entry;
    else this.#newest.newer = entry;
    this.#newest = entry;
  }
}

function entrySize(key: string, findings: readonly Finding[]): number {
  let size = ENTRY_OVERHEAD + key.length * 2;
  for (const f of findings) {
    size +=
      FINDING_OVERHEAD +
      2 * (f.inspector_type.length + f.severity.length + f.description.length + f.match.length + f.location.length);
  }
  return size;
}
