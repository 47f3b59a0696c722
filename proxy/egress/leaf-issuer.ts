import { X509Certificate } from 'node:crypto';
import { isIP } from 'node:net';
import { createSecureContext, type SecureContext } from 'node:tls';
import { issueCertificate, loadTls, type PemPair } from '../../core/tls.ts';
import { GatewayOptionsError } from './errors.ts';

// The leaves a terminated tunnel presents (docs/gateway.md, "Interception and capture"): one per host
// name, minted from the interception CA (--ca-cert/--ca-key) with the name as its only subject
// alternative name (a DNS name, or an IP address for an IP literal), served with the CA behind it (so a
// CA that is itself an intermediate of the operator's root verifies).
//
//   host ─▶ cache (LRU, MAX_LEAVES names) ─ hit, not near expiry ─▶ its SecureContext
//                                          └ miss ─▶ one mint per name, however many ask at once
//
// A leaf lives LEAF_LIFETIME_MS and is replaced RENEW_BEFORE_MS before it expires, so no client ever
// sees one expire during a handshake. The CA's key stays in this object; nothing logs it, and errors
// name the files, never their content.

export const LEAF_LIFETIME_MS = 24 * 3600_000;
export const RENEW_BEFORE_MS = 3600_000;
export const MAX_LEAVES = 1000;

interface Leaf {
  context: Promise<SecureContext>;
  /** When it must be replaced (its expiry less RENEW_BEFORE_MS). */
  renewAt: number;
}

export interface LeafIssuerOptions {
  lifetimeMs?: number;
  renewBeforeMs?: number;
  maxLeaves?: number;
  now?: () => number;
}

export class LeafIssuer {
  readonly #ca: PemPair;
  readonly #lifetime: number;
  readonly #renewBefore: number;
  readonly #max: number;
  readonly #now: () => number;
  /** Insertion order is recency: a hit moves its name to the end, the first name is the one evicted. */
  readonly #leaves = new Map<string, Leaf>();
  #minted = 0;

  constructor(ca: PemPair, options: LeafIssuerOptions = {}) {
    this.#ca = ca;
    this.#lifetime = options.lifetimeMs ?? LEAF_LIFETIME_MS;
    this.#renewBefore = Math.min(options.renewBeforeMs ?? RENEW_BEFORE_MS, this.#lifetime / 2);
    this.#max = options.maxLeaves ?? MAX_LEAVES;
    this.#now = options.now ?? Date.now;
  }

  /**
   * The issuer of --ca-cert/--ca-key; refuses a certificate that is not a CA, a key that is not its
   * own, or a key the leaves cannot be signed with (core/tls.ts signs ECDSA P-256 SHA-256): one leaf is
   * minted here so the start fails rather than the first tunnel.
   */
  static async load(certPath: string, keyPath: string, options: LeafIssuerOptions = {}): Promise<LeafIssuer> {
    const material = await loadTls({ cert: certPath, key: keyPath });
    if (!new X509Certificate(material.cert).ca)
      throw new GatewayOptionsError(`--ca-cert ${certPath} is not a CA certificate (basicConstraints CA:TRUE)`);
    const issuer = new LeafIssuer({ certPem: material.cert.toString(), keyPem: material.key.toString() }, options);
    try {
      await issuer.#mint('dvx-gateway-probe.invalid');
    } catch (err) {
      throw new GatewayOptionsError(
        `--ca-key ${keyPath} cannot sign the interception leaves (an ECDSA P-256 key is required)`,
        { cause: err },
      );
    }
    return issuer;
  }

  /** Leaves minted since the start (a cache hit mints none). */
  get minted(): number {
    return this.#minted;
  }

  /** Names held in the cache. */
  get size(): number {
    return this.#leaves.size;
  }

  /** The TLS context presenting `host`'s leaf (`host` as host-match.ts canonicalHost gives it). */
  context(host: string): Promise<SecureContext> {
    const now = this.#now();
    const hit = this.#leaves.get(host);
    this.#leaves.delete(host);
    if (hit !== undefined && hit.renewAt > now) {
      this.#leaves.set(host, hit);
      return hit.context;
    }
    const leaf: Leaf = { context: this.#mint(host), renewAt: now + this.#lifetime - this.#renewBefore };
    this.#minted++;
    this.#leaves.set(host, leaf);
    // A failed mint is not kept: the next handshake tries again.
    leaf.context.catch(() => {
      if (this.#leaves.get(host) === leaf) this.#leaves.delete(host);
    });
    while (this.#leaves.size > this.#max) {
      const oldest = this.#leaves.keys().next().value as string;
      this.#leaves.delete(oldest);
    }
    return leaf.context;
  }

  async #mint(host: string): Promise<SecureContext> {
    const ip = isIP(host) !== 0;
    const leaf = await issueCertificate(this.#ca, {
      commonName: host,
      ...(ip ? { ipAddresses: [host] } : { dnsNames: [host] }),
      lifetimeMs: this.#lifetime,
    });
    return createSecureContext({ cert: leaf.certPem + this.#ca.certPem, key: leaf.keyPem });
  }
}
