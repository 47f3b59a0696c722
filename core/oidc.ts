import { createRemoteJWKSet, jwtVerify, errors as joseErrors, customFetch, type JWTPayload } from 'jose';
import { fetchTrusting } from './fetch.ts';
import { AuthenticationError } from './errors.ts';

// Operator authentication by the OIDC issuer (spec: Authentication): discovery, then the issuer's JWKS
// through jose (keys cached, re-fetched on an unknown `kid`), `iss` checked, `aud` checked when an
// audience is configured. The authenticator that accepts a token fixes the principal kind: this one
// yields `human-operator` or `service` (a token whose subject is the client itself, as in the client
// credentials grant), never `agent-operator`, whatever the token claims.

export type PrincipalKind = 'human-operator' | 'service' | 'agent-operator';

export interface Principal {
  kind: PrincipalKind;
  subject: string;
  orgId: string;
  claims: JWTPayload;
}

// The caller an operator API authenticated, on its request (the control plane, the broker's operator listener).
declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
  }
}

export interface OidcOptions {
  issuer: string;
  audience?: string;
  orgClaim: string;
  /** Extra CA bundle for the issuer's endpoints. */
  ca?: Buffer;
}

function claim(payload: JWTPayload, path: string): unknown {
  let v: unknown = payload;
  for (const part of path.split('.')) v = (v as Record<string, unknown> | undefined)?.[part];
  return v;
}

/** Verified tokens are remembered until they expire (bounded; the whole map is dropped when full). */
const VERIFIED_MAX = 10_000;

export class OidcAuthenticator {
  #options: OidcOptions;
  #verified = new Map<string, { principal: Principal; exp: number }>();
  #jwks: ReturnType<typeof createRemoteJWKSet> | null = null;
  #issuer: string | null = null;
  #fetch: typeof fetch;

  constructor(options: OidcOptions) {
    this.#options = options;
    this.#fetch = fetchTrusting(options.ca);
  }

  async #keys(): Promise<{ jwks: ReturnType<typeof createRemoteJWKSet>; issuer: string }> {
    if (this.#jwks && this.#issuer) return { jwks: this.#jwks, issuer: this.#issuer };
    const base = this.#options.issuer.replace(/\/+$/, '');
    let doc: { issuer?: string; jwks_uri?: string };
    try {
      const res = await this.#fetch(`${base}/.well-known/openid-configuration`);
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      doc = (await res.json()) as typeof doc;
    } catch (err) {
      throw new AuthenticationError(`OIDC discovery failed: ${(err as Error).message}`, { cause: err });
    }
    if (!doc.jwks_uri || !doc.issuer) throw new AuthenticationError('OIDC discovery document lacks issuer or jwks_uri');
    this.#issuer = doc.issuer;
    this.#jwks = createRemoteJWKSet(new URL(doc.jwks_uri), {
      cooldownDuration: 30_000,
      cacheMaxAge: 600_000,
      [customFetch]: this.#fetch,
    });
    return { jwks: this.#jwks, issuer: this.#issuer };
  }

  async authenticate(token: string): Promise<Principal> {
    const hit = this.#verified.get(token);
    if (hit) {
      if (hit.exp * 1000 > Date.now()) return hit.principal;
      this.#verified.delete(token);
    }
    const principal = await this.#verify(token);
    if (this.#verified.size >= VERIFIED_MAX) this.#verified.clear();
    this.#verified.set(token, { principal, exp: Number(principal.claims.exp) });
    return principal;
  }

  async #verify(token: string): Promise<Principal> {
    const { jwks, issuer } = await this.#keys();
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, jwks, {
        issuer,
        ...(this.#options.audience ? { audience: this.#options.audience } : {}),
        algorithms: ['RS256', 'PS256', 'ES256', 'ES384', 'EdDSA'],
        requiredClaims: ['sub', 'exp'],
        clockTolerance: 5,
      }));
    } catch (err) {
      throw new AuthenticationError(
        err instanceof joseErrors.JWTExpired
          ? 'token expired'
          : err instanceof joseErrors.JWTClaimValidationFailed
            ? `token claim ${err.claim} invalid`
            : err instanceof joseErrors.JWKSNoMatchingKey
              ? 'token signed by an unknown key'
              : 'token rejected',
        { cause: err },
      );
    }
    const subject = String(payload.sub);
    const org = claim(payload, this.#options.orgClaim);
    return {
      kind: payload.client_id !== undefined && payload.client_id === payload.sub ? 'service' : 'human-operator',
      subject,
      orgId: typeof org === 'string' ? org : typeof org === 'number' ? String(org) : '',
      claims: payload,
    };
  }
}
