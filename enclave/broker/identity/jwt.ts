import { errors as joseErrors, jwtVerify } from 'jose';
import { PlatformJwtError, SigningKeyError } from '../../errors.ts';
import { CLOCK_TOLERANCE_S, PLATFORM_JWT_TTL_S, type SigningKeys } from './signing-keys.ts';

// The platform JWT presented on the broker's own agent routes, verified against the broker's own keys
// (never a remote JWKS): ES256 only, a published key, our issuer, not expired, a lifetime of at most
// 5 minutes, and the agent's claims present. Whatever fails is one PlatformJwtError (401); its message
// says which check, never the token.

const JWT_SHAPE = /^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;

export interface VerifiedAgentJwt {
  sub: string;
  org_id: string;
  agent_name: string;
  group_id: string | null;
  jti: string | null;
  iat: number;
  exp: number;
}

/** The bearer token of an `Authorization` header, or null when there is none of JWT shape. */
export function bearerToken(authorization: string | string[] | undefined): string | null {
  if (typeof authorization !== 'string') return null;
  const m = /^bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization);
  return m && JWT_SHAPE.test(m[1]) && m[1].length <= 8192 ? m[1] : null;
}

export async function verifyPlatformJwt(keys: SigningKeys, token: string, nowMs: number): Promise<VerifiedAgentJwt> {
  let payload;
  try {
    ({ payload } = await jwtVerify(token, keys.verificationKey, {
      algorithms: ['ES256'],
      issuer: keys.issuer,
      requiredClaims: ['sub', 'iat', 'exp'],
      clockTolerance: CLOCK_TOLERANCE_S,
      currentDate: new Date(nowMs),
    }));
  } catch (err) {
    // A store that does not answer while the keys are read is the broker's failure, not the token's.
    if (!(err instanceof joseErrors.JOSEError) && !(err instanceof SigningKeyError)) throw err;
    throw new PlatformJwtError(describe(err), { cause: err });
  }
  const { sub, org_id, agent_name, group_id, jti, iat, exp } = payload as Record<string, unknown>;
  if (typeof iat !== 'number' || typeof exp !== 'number') throw new PlatformJwtError('token lacks iat or exp');
  if (exp - iat > PLATFORM_JWT_TTL_S) throw new PlatformJwtError('token lifetime exceeds 5 minutes');
  if (iat > nowMs / 1000 + CLOCK_TOLERANCE_S) throw new PlatformJwtError('token issued in the future');
  if (typeof sub !== 'string' || sub === '' || typeof org_id !== 'string' || org_id === '')
    throw new PlatformJwtError('token lacks sub or org_id');
  return {
    sub,
    org_id,
    agent_name: typeof agent_name === 'string' ? agent_name : '',
    group_id: typeof group_id === 'string' && group_id !== '' ? group_id : null,
    jti: typeof jti === 'string' ? jti : null,
    iat,
    exp,
  };
}

function describe(err: unknown): string {
  if (err instanceof SigningKeyError) return err.message;
  if (err instanceof joseErrors.JWTExpired) return 'token expired';
  if (err instanceof joseErrors.JWTClaimValidationFailed) return `token claim ${err.claim} invalid (${err.reason})`;
  if (err instanceof joseErrors.JOSEAlgNotAllowed) return 'token algorithm not allowed (ES256 only)';
  if (err instanceof joseErrors.JWSSignatureVerificationFailed) return 'token signature invalid';
  if (err instanceof joseErrors.JWTInvalid || err instanceof joseErrors.JWSInvalid) return 'token malformed';
  return 'token rejected';
}
