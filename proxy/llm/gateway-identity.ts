import { createPrivateKey, createPublicKey, type KeyObject } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { jwtVerify, SignJWT, errors as joseErrors, type JWTPayload } from 'jose';
import { newId } from '../../core/ids.ts';
import type { AgentIdentity } from './auth.ts';
import { AuthError } from './errors.ts';

// The gateway's word for an agent (spec: Authentication, "service-signed identity headers forwarded by
// the network gateway"; docs/gateway.md, "Identity toward llmproxy"). The gateway has verified the
// agent (its platform JWT or identity certificate) and sends the request on to llmproxy with one header:
//
//   x-dvx-gateway-identity: <compact JWS, ES256, typ dvx-gateway-identity+jwt>
//     {iss: dvx-gateway, aud: dvx-llmproxy, sub: agent id, org_id, agent_name, group_id | null,
//      via: jwt | mtls, htm: method, htu: path with query, iat, exp: iat + 60, jti}
//
// llmproxy believes it only when it verifies with one of its --gateway-key keys, ES256 only, and names
// this very request (htm, htu): a header lifted from one call does not open another path. It lives 60 s:
// long enough for a clock skew and a slow start, short enough that a leaked one is soon worthless.
// This file is shared by both ends (the gateway signs, llmproxy verifies), the one place proxy/egress and
// proxy/llm meet the other way round (CONTRIBUTING.md, "Layout").

export const GATEWAY_IDENTITY_HEADER = 'x-dvx-gateway-identity';
export const GATEWAY_IDENTITY_TYP = 'dvx-gateway-identity+jwt';
export const GATEWAY_ISSUER = 'dvx-gateway';
export const GATEWAY_AUDIENCE = 'dvx-llmproxy';
export const GATEWAY_IDENTITY_LIFETIME_S = 60;
/** The clock skew forgiven between the gateway and llmproxy (exp, iat), as for platform JWTs. */
const CLOCK_TOLERANCE_S = 5;
const JWS_SHAPE = /^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;
/** A header longer than this is no identity the gateway signed (it signs ~600 bytes). */
const MAX_HEADER_LENGTH = 4096;
const KEY_LABELS = new Set(['PUBLIC KEY', 'PRIVATE KEY', 'EC PRIVATE KEY']);
const PEM_BLOCK = /-----BEGIN ([A-Z0-9 ]+)-----[\s\S]+?-----END \1-----/g;

/** How a key problem is reported: each server throws its own options error (OptionsError, GatewayOptionsError). */
export type KeyProblem = (message: string, cause?: unknown) => never;

function isP256(key: KeyObject): boolean {
  return key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1';
}

async function readKeyFile(path: string, flag: string, fail: KeyProblem): Promise<string> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    return fail(`cannot read ${flag} ${path}: ${(err as NodeJS.ErrnoException).code ?? 'unreadable'}`, err);
  }
}

/** The gateway's signing key: the one EC P-256 private key (PKCS#8 PEM) in `path`. */
export async function readSigningKey(path: string, flag: string, fail: KeyProblem): Promise<KeyObject> {
  const text = await readKeyFile(path, flag, fail);
  const blocks = [...text.matchAll(PEM_BLOCK)].filter((m) => m[1] !== 'EC PARAMETERS');
  if (blocks.length !== 1 || !/PRIVATE KEY$/.test(blocks[0]![1]!))
    return fail(`${flag} ${path} must hold one EC P-256 private key (PEM)`);
  let key: KeyObject;
  try {
    key = createPrivateKey(blocks[0]![0]);
  } catch (err) {
    return fail(`${flag} ${path} does not hold a readable private key`, err);
  }
  if (!isP256(key)) return fail(`${flag} ${path} is not an EC P-256 key (ES256 needs P-256)`);
  return key;
}

/**
 * llmproxy's verification keys: every EC P-256 key in `path`, public (SPKI PEM) or private (the public
 * one is derived from it). Two keys let the gateway's key be rotated without a refused call: llmproxy
 * takes both, then the gateway the new one, then llmproxy drops the old.
 */
export async function readVerifyKeys(path: string, flag: string, fail: KeyProblem): Promise<KeyObject[]> {
  const text = await readKeyFile(path, flag, fail);
  const keys: KeyObject[] = [];
  for (const [block, label] of text.matchAll(PEM_BLOCK)) {
    if (label === 'EC PARAMETERS') continue;
    // A certificate holds a key too, but naming one here is a mistake to point out, not to guess through.
    if (!KEY_LABELS.has(label!))
      return fail(`${flag} ${path}: a ${label} block is not a key (PEM public or private key)`);
    let key: KeyObject;
    try {
      key = createPublicKey(block);
    } catch (err) {
      return fail(`${flag} ${path}: a ${label} block is not a readable key`, err);
    }
    if (!isP256(key)) return fail(`${flag} ${path}: a ${label} block is not an EC P-256 key (ES256 needs P-256)`);
    keys.push(key);
  }
  if (keys.length === 0) return fail(`${flag} ${path} holds no PEM key`);
  return keys;
}

/** The gateway's side: one signed header per forwarded request. */
export class GatewayIdentitySigner {
  #key: KeyObject;
  #now: () => number;

  constructor(key: KeyObject, now: () => number = Date.now) {
    this.#key = key;
    this.#now = now;
  }

  /** The header value vouching for `identity`'s request `method` `path` (origin-form: path and query). */
  sign(identity: AgentIdentity, method: string, path: string): Promise<string> {
    const iat = Math.floor(this.#now() / 1000);
    return new SignJWT({
      org_id: identity.orgId,
      agent_name: identity.agentName,
      group_id: identity.groupId,
      via: identity.via,
      htm: method,
      htu: path,
    })
      .setProtectedHeader({ alg: 'ES256', typ: GATEWAY_IDENTITY_TYP })
      .setIssuer(GATEWAY_ISSUER)
      .setAudience(GATEWAY_AUDIENCE)
      .setSubject(identity.agentId)
      .setIssuedAt(iat)
      .setExpirationTime(iat + GATEWAY_IDENTITY_LIFETIME_S)
      .setJti(newId())
      .sign(this.#key);
  }
}

/** The request a header must name: its method and its URL as received (origin-form: path and query). */
export interface VouchedRequest {
  method: string;
  url: string;
}

interface Vouched {
  identity: AgentIdentity;
  exp: number;
  htm: string;
  htu: string;
}

/** llmproxy's side: a header verified, or an AuthError with reason `gateway` (the 401 of any bad credential). */
export class GatewayIdentityVerifier {
  #keys: readonly KeyObject[];
  #cache = new Map<string, Vouched>();
  #maxCache: number;
  #now: () => number;

  constructor(keys: readonly KeyObject[], options: { maxCache?: number; now?: () => number } = {}) {
    this.#keys = keys;
    this.#maxCache = options.maxCache ?? 50_000;
    this.#now = options.now ?? Date.now;
  }

  async verify(header: string, request: VouchedRequest): Promise<AgentIdentity> {
    const nowS = this.#now() / 1000;
    // A header verified before is believed again until its exp (an ES256 verify is ~100 µs), but only
    // for the request it names.
    const hit = this.#cache.get(header);
    if (hit) {
      if (hit.exp > nowS) return matching(hit, request);
      this.#cache.delete(header);
    }
    if (header.length > MAX_HEADER_LENGTH || !JWS_SHAPE.test(header))
      throw new AuthError('gateway', 'gateway identity header malformed');
    const payload = await this.#verifySignature(header);
    // From here the gateway vouches for the claims: a refusal names the agent (and is audited as its).
    const identity = identityOf(payload);
    if (!identity) throw new AuthError('gateway', 'gateway identity header lacks sub, org_id or via');
    const exp = payload.exp!;
    if (exp - payload.iat! > GATEWAY_IDENTITY_LIFETIME_S + CLOCK_TOLERANCE_S)
      throw new AuthError('gateway', 'gateway identity header lifetime exceeds 60 s', identity);
    if (typeof payload.htm !== 'string' || typeof payload.htu !== 'string')
      throw new AuthError('gateway', 'gateway identity header lacks htm or htu', identity);
    const vouched: Vouched = { identity, exp, htm: payload.htm, htu: payload.htu };
    if (this.#cache.size >= this.#maxCache) this.#cache.delete(this.#cache.keys().next().value!);
    this.#cache.set(header, vouched);
    return matching(vouched, request);
  }

  async #verifySignature(header: string): Promise<JWTPayload> {
    let last: unknown;
    for (const key of this.#keys) {
      try {
        const { payload } = await jwtVerify(header, key, {
          algorithms: ['ES256'],
          typ: GATEWAY_IDENTITY_TYP,
          issuer: GATEWAY_ISSUER,
          audience: GATEWAY_AUDIENCE,
          requiredClaims: ['exp', 'iat', 'sub', 'jti'],
          maxTokenAge: GATEWAY_IDENTITY_LIFETIME_S,
          clockTolerance: CLOCK_TOLERANCE_S,
          currentDate: new Date(this.#now()),
        });
        return payload;
      } catch (err) {
        // Another key of the set may have signed it (a rotation); anything else is final.
        if (err instanceof joseErrors.JWSSignatureVerificationFailed) {
          last = err;
          continue;
        }
        throw refusal(err);
      }
    }
    throw refusal(last);
  }
}

function matching(vouched: Vouched, request: VouchedRequest): AgentIdentity {
  if (vouched.htm !== request.method || vouched.htu !== request.url)
    throw new AuthError(
      'gateway',
      'gateway identity header names another request (htm/htu differ from this method and path)',
      vouched.identity,
    );
  return vouched.identity;
}

function refusal(err: unknown): AuthError {
  // jose checks the claims only once the signature verified: a claim refusal names the gateway's agent.
  const signed =
    err instanceof joseErrors.JWTClaimValidationFailed || err instanceof joseErrors.JWTExpired
      ? identityOf(err.payload)
      : null;
  const what =
    err instanceof joseErrors.JWTExpired
      ? 'expired'
      : err instanceof joseErrors.JWTClaimValidationFailed
        ? `claim ${err.claim} invalid (${err.reason})`
        : err instanceof joseErrors.JOSEAlgNotAllowed
          ? 'algorithm not allowed (ES256 only)'
          : err instanceof joseErrors.JWSSignatureVerificationFailed
            ? 'not signed by a --gateway-key key'
            : err instanceof joseErrors.JWTInvalid || err instanceof joseErrors.JWSInvalid
              ? 'malformed'
              : 'rejected';
  return new AuthError('gateway', `gateway identity header ${what}`, signed, { cause: err });
}

const nonEmpty = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null);

/** The identity the gateway's claims name; null when they do not name one. */
function identityOf(payload: JWTPayload): AgentIdentity | null {
  const agentId = nonEmpty(payload.sub);
  const orgId = nonEmpty(payload.org_id);
  const via = payload.via;
  if (!agentId || !orgId || (via !== 'jwt' && via !== 'mtls')) return null;
  return {
    agentId,
    orgId,
    agentName: typeof payload.agent_name === 'string' ? payload.agent_name : '',
    groupId: nonEmpty(payload.group_id),
    via: 'gateway',
    // As for mTLS: the agent's own Authorization / x-api-key are its passthrough credential (credentials.ts).
    tokenHeader: null,
  };
}
