import type { IncomingHttpHeaders } from 'node:http';
import type { TLSSocket } from 'node:tls';
import type { X509Certificate } from 'node:crypto';
import { AuthError, type AuthFailure } from './errors.ts';
import { GATEWAY_IDENTITY_HEADER, type GatewayIdentityVerifier, type VouchedRequest } from './gateway-identity.ts';
import { fetchTrusting } from '../../core/fetch.ts';
import {
  createLocalJWKSet,
  createRemoteJWKSet,
  customFetch,
  jwtVerify,
  errors as joseErrors,
  type JWTPayload,
  type JWTVerifyGetKey,
  type JSONWebKeySet,
} from 'jose';

// Agent identity (spec: Authentication). Three ways in:
//   1. the platform JWT (ES256, 5-minute lifetime) in `Authorization: Bearer` or `x-api-key` (the
//      official SDKs send one or the other), verified against --agent-jwks; a verified token is cached
//      until its `exp`, since an ES256 verify costs ~100 µs and agents send the same token many times.
//   2. an agent identity certificate (ECDSA P-256) verified against --agent-ca over mTLS.
//   3. the network gateway's signed identity header (gateway-identity.ts), verified against
//      --gateway-key: the gateway verified the agent by 1 or 2 and vouches for this one request.
// A presented credential must verify: a bad one is never rescued by another. The gateway's header
// comes first: when it is present, nothing else is read as the caller (a llmproxy without
// --gateway-key refuses it rather than ignore it), and the agent's own Authorization / x-api-key are
// its passthrough credential, as over mTLS.

export interface AgentIdentity {
  agentId: string;
  orgId: string;
  agentName: string;
  groupId: string | null;
  /** How the caller proved who it is; `gateway`: the network gateway's signed header vouches for it. */
  via: 'jwt' | 'mtls' | 'gateway';
  /** The header that carried the JWT; in passthrough mode the other one carries the agent's own key. */
  tokenHeader: 'authorization' | 'x-api-key' | null;
}

export const MAX_TOKEN_LIFETIME_S = 300;
/** The clock skew forgiven on a token's exp, iat and nbf: a token is refused from exp + this on. */
export const CLOCK_TOLERANCE_S = 5;
const JWT_SHAPE = /^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

export function jwksFromDocument(doc: unknown): JWTVerifyGetKey {
  return createLocalJWKSet(doc as JSONWebKeySet);
}

/** A remote JWKS (the broker's `/.well-known/jwks.json`), fetched trusting `ca` too when given. */
export function jwksFromUrl(url: string, ca?: Buffer): JWTVerifyGetKey {
  return createRemoteJWKSet(new URL(url), {
    cooldownDuration: 5_000,
    cacheMaxAge: 600_000,
    ...(ca ? { [customFetch]: fetchTrusting(ca) } : {}),
  });
}

/** The token and the header it came in, or null when neither header holds something JWT-shaped. */
export function presentedToken(
  headers: IncomingHttpHeaders,
): { token: string; header: 'authorization' | 'x-api-key' } | null {
  const auth = headers.authorization;
  if (typeof auth === 'string' && /^bearer\s+/i.test(auth)) {
    const token = auth.replace(/^bearer\s+/i, '').trim();
    if (JWT_SHAPE.test(token)) return { token, header: 'authorization' };
  }
  const key = headers['x-api-key'];
  if (typeof key === 'string' && JWT_SHAPE.test(key.trim())) return { token: key.trim(), header: 'x-api-key' };
  return null;
}

function claimString(v: unknown): string | null {
  if (typeof v === 'string' && v !== '') return v;
  if (typeof v === 'number' && Number.isFinite(v)) return String(v);
  return null;
}

export class AgentAuthenticator {
  #keys: () => JWTVerifyGetKey;
  #gateway: GatewayIdentityVerifier | null;
  #cache = new Map<string, { identity: AgentIdentity; exp: number }>();
  #maxCache: number;
  #now: () => number;

  constructor(options: {
    keys: () => JWTVerifyGetKey;
    /** Verifies the gateway's identity header (--gateway-key); null: the header is refused. */
    gateway?: GatewayIdentityVerifier | null;
    maxCache?: number;
    now?: () => number;
  }) {
    this.#keys = options.keys;
    this.#gateway = options.gateway ?? null;
    this.#maxCache = options.maxCache ?? 50_000;
    this.#now = options.now ?? Date.now;
  }

  /** Drops cached verifications (the key set changed). */
  clearCache(): void {
    this.#cache.clear();
  }

  async verifyToken(token: string, header: AgentIdentity['tokenHeader']): Promise<AgentIdentity> {
    const nowS = this.#now() / 1000;
    const hit = this.#cache.get(token);
    if (hit) {
      if (hit.exp > nowS)
        return hit.identity.tokenHeader === header ? hit.identity : { ...hit.identity, tokenHeader: header };
      this.#cache.delete(token);
    }
    let payload;
    try {
      ({ payload } = await jwtVerify(token, this.#keys(), {
        algorithms: ['ES256'],
        requiredClaims: ['exp', 'sub'],
        clockTolerance: CLOCK_TOLERANCE_S,
        currentDate: new Date(this.#now()),
      }));
    } catch (err) {
      // jose checks the claims only once the signature has verified: their payload is the issuer's.
      const signed =
        err instanceof joseErrors.JWTClaimValidationFailed || err instanceof joseErrors.JWTExpired
          ? identityOf(err.payload, header)
          : null;
      const [reason, message] = describeJoseError(err);
      throw new AuthError(reason, message, signed);
    }
    const exp = payload.exp!;
    const issuedAt = typeof payload.iat === 'number' ? payload.iat : nowS;
    const identity = identityOf(payload, header);
    if (exp - Math.min(issuedAt, nowS) > MAX_TOKEN_LIFETIME_S + CLOCK_TOLERANCE_S) {
      throw new AuthError('lifetime', 'token lifetime exceeds 5 minutes', identity);
    }
    if (!identity) throw new AuthError('lacks', 'token lacks sub or org_id');
    if (this.#cache.size >= this.#maxCache) this.#cache.delete(this.#cache.keys().next().value!);
    this.#cache.set(token, { identity, exp });
    return identity;
  }

  /**
   * The caller's identity: the gateway's identity header when one is present (it must name `request`,
   * the request being served; without `request` it cannot be checked and is refused), else the JWT when
   * one is presented, else a verified client certificate (CN = agent id, O = org id, OU = group id).
   * Throws AuthError when none holds.
   */
  async authenticate(
    headers: IncomingHttpHeaders,
    socket: TLSSocket | null,
    request: VouchedRequest | null = null,
  ): Promise<AgentIdentity> {
    const vouch = headers[GATEWAY_IDENTITY_HEADER];
    if (vouch !== undefined) {
      if (!this.#gateway)
        throw new AuthError('gateway', 'a gateway identity header, and no --gateway-key to verify it with');
      if (!request || typeof vouch !== 'string')
        throw new AuthError('gateway', 'a gateway identity header where none can be checked');
      return this.#gateway.verify(vouch, request);
    }
    const presented = presentedToken(headers);
    if (presented) return this.verifyToken(presented.token, presented.header);
    const fromCert = socket ? certificateIdentity(socket) : null;
    if (fromCert) return fromCert;
    throw new AuthError('agent', 'missing agent credential (platform JWT or identity certificate)');
  }
}

/** The identity a verified token's claims name; null without both `sub` and `org_id`. */
function identityOf(payload: JWTPayload, header: AgentIdentity['tokenHeader']): AgentIdentity | null {
  const agentId = claimString(payload.sub);
  const orgId = claimString(payload.org_id);
  if (!agentId || !orgId) return null;
  return {
    agentId,
    orgId,
    agentName: typeof payload.agent_name === 'string' ? payload.agent_name : '',
    groupId: claimString(payload.group_id),
    via: 'jwt',
    tokenHeader: header,
  };
}

/**
 * The agent an mTLS client certificate names (CN agent, O org, OU group); null without one the
 * --agent-ca verified at the handshake; throws AuthError('expired') once it is outside its validity.
 */
export function certificateIdentity(socket: TLSSocket): AgentIdentity | null {
  if (typeof socket.getPeerX509Certificate !== 'function' || !socket.authorized) return null;
  const cert: X509Certificate | undefined = socket.getPeerX509Certificate();
  if (!cert) return null;
  const key = cert.publicKey;
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1') return null;
  const fields = new Map<string, string>();
  for (const line of cert.subject.split('\n')) {
    const at = line.indexOf('=');
    if (at > 0) fields.set(line.slice(0, at), line.slice(at + 1));
  }
  const agentId = fields.get('CN');
  const orgId = fields.get('O');
  if (!agentId || !orgId) return null;
  const identity: AgentIdentity = {
    agentId,
    orgId,
    agentName: '',
    groupId: fields.get('OU') ?? null,
    via: 'mtls',
    tokenHeader: null,
  };
  // TLS checked the validity window once, at the handshake; a kept-alive connection outlives it. So it
  // is checked again for every request: an expired certificate is refused as no credential is. The
  // CA vouches for the subject, so the refusal is that agent's (recorded, as an expired token's is).
  const now = Date.now();
  const notBefore = Date.parse(cert.validFrom);
  const notAfter = Date.parse(cert.validTo);
  if (!(now >= notBefore && now <= notAfter))
    throw new AuthError(
      'expired',
      now > notAfter
        ? `identity certificate expired at ${new Date(notAfter).toISOString()}`
        : 'identity certificate not yet valid',
      identity,
    );
  return identity;
}

/** The metric label and the message of a token jose refused. */
function describeJoseError(err: unknown): [AuthFailure, string] {
  if (err instanceof joseErrors.JWTExpired) return ['expired', 'token expired'];
  if (err instanceof joseErrors.JWTClaimValidationFailed) {
    return ['claim', `token claim ${err.claim} invalid (${err.reason})`];
  }
  if (err instanceof joseErrors.JOSEAlgNotAllowed) return ['algorithm', 'token algorithm not allowed (ES256 only)'];
  if (err instanceof joseErrors.JWKSNoMatchingKey) return ['signed', 'token signed by an unknown key'];
  if (err instanceof joseErrors.JWSSignatureVerificationFailed) return ['signature', 'token signature invalid'];
  const malformed = err instanceof joseErrors.JWTInvalid || err instanceof joseErrors.JWSInvalid;
  if (malformed) return ['malformed', 'token malformed'];
  return ['rejected', 'token rejected'];
}
