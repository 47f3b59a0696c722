import {
  calculateJwkThumbprint,
  exportJWK,
  generateKeyPair,
  importJWK,
  SignJWT,
  type CryptoKey,
  type JWK,
  type JWTHeaderParameters,
} from 'jose';
import { parseAddr } from '../../../core/addr.ts';
import { newId } from '../../../core/ids.ts';
import { SigningKeyError } from '../../errors.ts';
import type { BrokerDeps } from '../deps.ts';
import type { BrokerOptions } from '../options.ts';

// The ES256 keys that sign the platform JWT (spec: Authentication), kept in broker_signing_keys with the
// private JWK sealed under the broker's data key, so every broker process on one store signs with the
// same key and publishes the same JWKS.
//
// A key's life (docs/decisions.md, "Platform JWT signing keys"):
//   created      published in the JWKS at once, `activates_at` PRE_PUBLISH ahead (a verifier that cached
//                the JWKS before the key signed anything knows it when its first token arrives);
//   activates_at signs from then until its successor activates (--key-rotation later);
//   retires_at   the successor's activation: it signs no more, but stays published until every token it
//                signed has expired (retires_at + the token lifetime + tolerance), then it is deleted.
// The first key of an empty store activates at once (nobody can have cached an empty JWKS worth keeping).

/** The platform JWT's lifetime (spec: Authentication, "5-minute lifetime"). */
export const PLATFORM_JWT_TTL_S = 300;
/** Clock skew allowed between the broker and a verifier, on `exp` and on a key's retention. */
export const CLOCK_TOLERANCE_S = 5;
/** How long a retired key stays published: a token it signed just before retiring lives this long. */
export const RETENTION_MS = (PLATFORM_JWT_TTL_S + 60) * 1000;
/** How long before it signs a new key is in the JWKS (llmproxy caches the JWKS for up to 10 minutes). */
export const MAX_PRE_PUBLISH_MS = 10 * 60_000;
/** How long the keys read from the store are trusted before they are read again. */
const CACHE_MS = 5_000;
/** Advisory lock of key creation: processes sharing a store create one key per rotation, not one each. */
const LOCK_KEY = 0x64767804; // "dvx" + 4 (2: broker migrations, 3: data keys)

/** The agent's claims of its platform JWT; `iss`, `iat`, `exp` and `jti` are added by `mint`. */
export interface PlatformClaims {
  sub: string;
  org_id: string;
  agent_name: string;
  group_id: string | null;
}

export interface MintedJwt {
  jwt: string;
  kid: string;
  jti: string;
  /** Seconds since the epoch. */
  exp: number;
}

interface KeyRow {
  kid: string;
  private_sealed: string;
  public_jwk: JWK;
  activates_at: number;
  retires_at: number | null;
}

type StoredRow = Omit<KeyRow, 'activates_at' | 'retires_at'> & {
  activates_at: Date | string;
  retires_at: Date | string | null;
};

const ms = (v: Date | string) => new Date(v).getTime();

/** The broker's public agent base URL: --public-url, else https://<--addr> (a wildcard host as localhost). */
export function agentBaseUrl(options: Pick<BrokerOptions, 'publicUrl' | 'addr'>): string {
  if (options.publicUrl) return options.publicUrl.replace(/\/+$/, '');
  const { host, port } = parseAddr(options.addr);
  const name = !host || host === '0.0.0.0' || host === '::' ? 'localhost' : host.includes(':') ? `[${host}]` : host;
  return `https://${name}:${port}`;
}

export interface SigningKeysOptions {
  /** The JWT's `iss`; by default agentBaseUrl(deps.options). */
  issuer?: string;
  /** How often a timer checks whether a rotation (or a deletion) is due; 0 runs no timer. Default 60 s. */
  checkEveryMs?: number;
}

export class SigningKeys {
  readonly issuer: string;
  #deps: BrokerDeps;
  #rows: KeyRow[] = [];
  #readAt = Number.NEGATIVE_INFINITY;
  #reading: Promise<void> | null = null;
  #private = new Map<string, Promise<CryptoKey>>();
  #public = new Map<string, Promise<CryptoKey>>();
  #timer: NodeJS.Timeout | null = null;
  #rotating: Promise<boolean> | null = null;

  private constructor(deps: BrokerDeps, issuer: string) {
    this.#deps = deps;
    this.issuer = issuer;
  }

  /** The keys of the store, a first one created when it has none; with a timer that rotates them when due. */
  static async open(deps: BrokerDeps, options: SigningKeysOptions = {}): Promise<SigningKeys> {
    const keys = new SigningKeys(deps, options.issuer ?? agentBaseUrl(deps.options));
    await keys.rotateIfDue();
    const every = options.checkEveryMs ?? 60_000;
    if (every > 0) {
      keys.#timer = setInterval(() => {
        keys.rotateIfDue().catch((err: unknown) => deps.log.warn({ err }, 'signing-key rotation check failed'));
      }, every);
      keys.#timer.unref();
    }
    return keys;
  }

  close(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** How long a new key is published before it signs: 10 minutes, or half the rotation period if shorter. */
  get prePublishMs(): number {
    return Math.min(MAX_PRE_PUBLISH_MS, this.#deps.options.keyRotation / 2);
  }

  /** Signs a platform JWT for `claims` with the key active now (ES256, 5 minutes, `kid` in the header). */
  async mint(claims: PlatformClaims): Promise<MintedJwt> {
    const now = this.#deps.now();
    const row = await this.#activeAt(now);
    const key = await this.#privateKey(row);
    const iat = Math.floor(now / 1000);
    const exp = iat + PLATFORM_JWT_TTL_S;
    const jti = newId();
    const jwt = await new SignJWT({ org_id: claims.org_id, agent_name: claims.agent_name, group_id: claims.group_id })
      .setProtectedHeader({ alg: 'ES256', kid: row.kid, typ: 'JWT' })
      .setIssuer(this.issuer)
      .setSubject(claims.sub)
      .setIssuedAt(iat)
      .setExpirationTime(exp)
      .setJti(jti)
      .sign(key);
    return { jwt, kid: row.kid, jti, exp };
  }

  /** The published public keys: the active one, one pre-published, and retired ones whose tokens may live. */
  async jwks(): Promise<{ keys: JWK[] }> {
    const now = this.#deps.now();
    await this.#fresh(now);
    return { keys: this.#published(now).map((r) => ({ ...r.public_jwk })) };
  }

  /**
   * The public key a token's header names, for jose's jwtVerify: only a published key, only ES256.
   * A kid this process has not read yet makes it read the store again (at most once per cache period).
   */
  verificationKey = async (header: JWTHeaderParameters): Promise<CryptoKey> => {
    if (header.alg !== 'ES256') throw new SigningKeyError('token algorithm not allowed (ES256 only)');
    if (typeof header.kid !== 'string' || header.kid === '') throw new SigningKeyError('token names no key (kid)');
    const now = this.#deps.now();
    await this.#fresh(now);
    let row = this.#published(now).find((r) => r.kid === header.kid);
    if (!row && now - this.#readAt >= 1000) {
      await this.#read(now);
      row = this.#published(now).find((r) => r.kid === header.kid);
    }
    if (!row) throw new SigningKeyError('token signed by an unknown key');
    let key = this.#public.get(row.kid);
    if (!key) {
      key = importJWK(row.public_jwk, 'ES256') as Promise<CryptoKey>;
      this.#public.set(row.kid, key);
    }
    return key;
  };

  /**
   * Creates the next key when the newest one has signed for (rotation − pre-publication), or the first
   * key of an empty store, and deletes keys whose tokens have all expired. Safe to run from several
   * processes at once: the decision is taken again under an advisory lock. True when it created a key.
   */
  rotateIfDue(): Promise<boolean> {
    this.#rotating ??= this.#rotate().finally(() => {
      this.#rotating = null;
    });
    return this.#rotating;
  }

  async #rotate(): Promise<boolean> {
    const now = this.#deps.now();
    const db = this.#deps.db;
    await this.#read(now);
    const expired = this.#rows.filter((r) => r.retires_at !== null && r.retires_at + RETENTION_MS <= now);
    if (expired.length > 0)
      await db.query('DELETE FROM broker_signing_keys WHERE retires_at IS NOT NULL AND retires_at <= $1', [
        new Date(now - RETENTION_MS),
      ]);
    if (!this.#due(this.#rows, now)) {
      if (expired.length > 0) await this.#read(now);
      return false;
    }
    // The key is made and sealed outside the transaction (the sealer may use the store itself), then
    // stored only if no other process stored one meanwhile.
    const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
    const publicJwk = await exportJWK(publicKey);
    const kid = await calculateJwkThumbprint(publicJwk);
    const sealed = await this.#deps.sealer.seal(JSON.stringify(await exportJWK(privateKey)));
    const created = await db.transaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock($1)', [LOCK_KEY]);
      const { rows } = await tx.query<StoredRow>(
        'SELECT kid, activates_at, retires_at FROM broker_signing_keys ORDER BY activates_at DESC LIMIT 1',
      );
      const newest = rows.map(toRow);
      if (!this.#due(newest, now)) return false;
      const activates = newest.length === 0 ? now : now + this.prePublishMs;
      await tx.query('UPDATE broker_signing_keys SET retires_at = $1 WHERE retires_at IS NULL', [new Date(activates)]);
      await tx.query(
        'INSERT INTO broker_signing_keys (kid, private_sealed, public_jwk, created_at, activates_at) VALUES ($1, $2, $3, $4, $5)',
        [
          kid,
          sealed,
          JSON.stringify({ ...publicJwk, kid, alg: 'ES256', use: 'sig' }),
          new Date(now),
          new Date(activates),
        ],
      );
      return true;
    });
    if (created) this.#deps.log.info({ kid }, 'platform JWT signing key created');
    await this.#read(now);
    return created;
  }

  /** Whether the newest of `rows` (sorted newest first) has signed long enough for its successor to be made. */
  #due(rows: Pick<KeyRow, 'activates_at'>[], now: number): boolean {
    const newest = rows[0];
    if (!newest) return true;
    return now >= newest.activates_at + this.#deps.options.keyRotation - this.prePublishMs;
  }

  #published(now: number): KeyRow[] {
    return this.#rows.filter((r) => r.retires_at === null || r.retires_at + RETENTION_MS > now);
  }

  async #activeAt(now: number): Promise<KeyRow> {
    await this.#fresh(now);
    let row = this.#signing(now);
    if (!row) {
      await this.rotateIfDue();
      row = this.#signing(now);
    }
    if (!row) throw new SigningKeyError('no platform JWT signing key is active');
    return row;
  }

  /** The key that signs at `now`: the newest one activated (its successor, if any, not yet active). */
  #signing(now: number): KeyRow | undefined {
    return this.#rows.find((r) => r.activates_at <= now && (r.retires_at === null || r.retires_at > now));
  }

  #privateKey(row: KeyRow): Promise<CryptoKey> {
    let key = this.#private.get(row.kid);
    if (!key) {
      key = this.#deps.sealer
        .open(row.private_sealed)
        .then((jwk) => importJWK(JSON.parse(jwk) as JWK, 'ES256') as Promise<CryptoKey>)
        .catch((err: unknown) => {
          this.#private.delete(row.kid);
          throw new SigningKeyError(`signing key ${row.kid} cannot be opened`, { cause: err });
        });
      this.#private.set(row.kid, key);
    }
    return key;
  }

  async #fresh(now: number): Promise<void> {
    if (now - this.#readAt < CACHE_MS && now >= this.#readAt) return;
    await this.#read(now);
  }

  /** Reads every key (a handful) from the store; concurrent callers share one read. */
  #read(now: number): Promise<void> {
    this.#reading ??= this.#deps.db
      .query<StoredRow>(
        'SELECT kid, private_sealed, public_jwk, activates_at, retires_at FROM broker_signing_keys ORDER BY activates_at DESC',
      )
      .then(({ rows }) => {
        this.#rows = rows.map(toRow);
        this.#readAt = now;
        const live = new Set(this.#rows.map((r) => r.kid));
        for (const kid of this.#private.keys()) if (!live.has(kid)) this.#private.delete(kid);
        for (const kid of this.#public.keys()) if (!live.has(kid)) this.#public.delete(kid);
      })
      .finally(() => {
        this.#reading = null;
      });
    return this.#reading;
  }
}

function toRow(r: StoredRow): KeyRow {
  return {
    kid: r.kid,
    private_sealed: r.private_sealed,
    public_jwk: typeof r.public_jwk === 'string' ? (JSON.parse(r.public_jwk) as JWK) : r.public_jwk,
    activates_at: ms(r.activates_at),
    retires_at: r.retires_at === null ? null : ms(r.retires_at),
  };
}
