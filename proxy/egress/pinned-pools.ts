import type { LookupAddress, LookupOptions } from 'node:dns';
import { getCACertificates } from 'node:tls';
import { Pool } from 'undici';

// Connections to a destination at the address its policy check admitted (docs/gateway.md, "Destination
// policy"): one keep-alive undici Pool per (scheme, host, port, address), whose socket "resolves" the
// host to that address and nothing else, so the name is never looked up again (no DNS rebinding
// between the check and the connection) while the TLS server name and the Host header stay the
// host's. Pools are kept for the MAX_POOLS most recently used destinations; an evicted pool closes once
// its requests are done.

export const MAX_POOLS = 512;

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

export interface PinnedPoolOptions {
  /** Extra CA bundle trusted beside the system's (--upstream-ca). */
  upstreamCa: Buffer | undefined;
  connectTimeoutMs: number;
}

export class PinnedPools {
  readonly #pools = new Map<string, Pool>();
  readonly #connectTimeout: number;
  readonly #ca: string[] | undefined;

  constructor(options: PinnedPoolOptions) {
    this.#connectTimeout = options.connectTimeoutMs;
    // The default store (bundled, plus the system's and NODE_EXTRA_CA_CERTS when node was told so),
    // and --upstream-ca beside it: setting `ca` alone would replace the default store.
    this.#ca = options.upstreamCa ? [...getCACertificates('default'), options.upstreamCa.toString()] : undefined;
  }

  /** The origin (`scheme://host:port`) and the pool connecting to `address` for it. */
  get(
    scheme: 'http' | 'https',
    host: string,
    port: number,
    address: string,
    family: 4 | 6,
  ): { origin: string; dispatcher: Pool } {
    const origin = `${scheme}://${host.includes(':') ? `[${host}]` : host}:${port}`;
    const key = `${origin}\u0000${address}`;
    let pool = this.#pools.get(key);
    if (pool !== undefined) {
      this.#pools.delete(key);
      this.#pools.set(key, pool);
      return { origin, dispatcher: pool };
    }
    const lookup = (_host: string, options: LookupOptions, callback: LookupCallback) => {
      if (options.all) callback(null, [{ address, family }]);
      else callback(null, address, family);
    };
    pool = new Pool(origin, {
      connections: 64,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      connect: {
        timeout: this.#connectTimeout,
        lookup,
        ...(scheme === 'https' && this.#ca !== undefined ? { ca: this.#ca } : {}),
      },
    });
    this.#pools.set(key, pool);
    while (this.#pools.size > MAX_POOLS) {
      const [oldest, evicted] = this.#pools.entries().next().value as [string, Pool];
      this.#pools.delete(oldest);
      void evicted.close().catch(() => undefined);
    }
    return { origin, dispatcher: pool };
  }

  async close(): Promise<void> {
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.all(pools.map((p) => p.destroy().catch(() => undefined)));
  }
}
