import {
  exportJWK,
  generateKeyPair,
  importJWK,
  jwtVerify,
  SignJWT,
  errors as joseErrors,
  type JWK,
  type CryptoKey,
} from 'jose';
import { newId } from '../../core/ids.ts';
import type { Queryable } from '../../core/sql.ts';
import type { Principal } from '../../core/oidc.ts';
import { AuthenticationError } from '../errors.ts';

// The control plane's own issuer for the agent-operator caller class (spec: "Agent operators"):
// ES256 tokens living --agent-token-ttl (60 s by default), minted for `agent:<uid>` of an org, served
// with `/.well-known/openid-configuration` and `/.well-known/jwks.json` at --agent-token-issuer-url.
// The signing key lives in the store so every replica signs and verifies with the same one. A token
// carrying this issuer is verified here and only here: it is never handed on to the OIDC authenticator.

export const DEFAULT_AGENT_TOKEN_TTL_S = 60;

export class AgentOperatorIssuer {
  readonly issuer: string;
  readonly ttlSeconds: number;
  #kid: string;
  #privateKey: CryptoKey;
  #publicKey: CryptoKey;
  #publicJwk: JWK;

  private constructor(
    issuer: string,
    ttl: number,
    kid: string,
    privateKey: CryptoKey,
    publicKey: CryptoKey,
    publicJwk: JWK,
  ) {
    this.issuer = issuer;
    this.ttlSeconds = ttl;
    this.#kid = kid;
    this.#privateKey = privateKey;
    this.#publicKey = publicKey;
    this.#publicJwk = publicJwk;
  }

  /** Loads the newest signing key from the store, creating one on the first start. */
  static async open(db: Queryable, issuer: string, ttlSeconds: number): Promise<AgentOperatorIssuer> {
    const { rows } = await db.query<{ kid: string; private_jwk: string }>(
      'SELECT kid, private_jwk FROM signing_keys ORDER BY created_at DESC LIMIT 1',
    );
    let kid: string;
    let jwk: JWK;
    if (rows.length > 0) {
      kid = rows[0].kid;
      jwk = JSON.parse(rows[0].private_jwk) as JWK;
    } else {
      const { privateKey } = await generateKeyPair('ES256', { extractable: true });
      kid = `ao-${newId()}`;
      jwk = await exportJWK(privateKey);
      await db.query('INSERT INTO signing_keys (kid, private_jwk) VALUES ($1, $2) ON CONFLICT DO NOTHING', [
        kid,
        JSON.stringify(jwk),
      ]);
      const again = await db.query<{ kid: string; private_jwk: string }>(
        'SELECT kid, private_jwk FROM signing_keys ORDER BY created_at DESC LIMIT 1',
      );
      kid = again.rows[0].kid; // a replica that won the race keeps its key
      jwk = JSON.parse(again.rows[0].private_jwk) as JWK;
    }
    const privateKey = (await importJWK(jwk, 'ES256')) as CryptoKey;
    const { d: _d, ...publicJwk } = jwk;
    const publicKey = (await importJWK(publicJwk, 'ES256')) as CryptoKey;
    return new AgentOperatorIssuer(
      issuer.replace(/\/+$/, ''),
      ttlSeconds || DEFAULT_AGENT_TOKEN_TTL_S,
      kid,
      privateKey,
      publicKey,
      { ...publicJwk, kid, alg: 'ES256', use: 'sig' },
    );
  }

  discovery(): Record<string, unknown> {
    return {
      issuer: this.issuer,
      jwks_uri: `${this.issuer}/.well-known/jwks.json`,
      id_token_signing_alg_values_supported: ['ES256'],
      token_endpoint_auth_methods_supported: ['none'],
      response_types_supported: ['token'],
    };
  }

  jwks(): { keys: JWK[] } {
    return { keys: [this.#publicJwk] };
  }

  async mint(
    org: string,
    agentUid: string,
  ): Promise<{ access_token: string; token_type: 'Bearer'; expires_in: number }> {
    const now = Math.floor(Date.now() / 1000);
    const token = await new SignJWT({ org_id: org, kind: 'agent-operator' })
      .setProtectedHeader({ alg: 'ES256', kid: this.#kid, typ: 'JWT' })
      .setIssuer(this.issuer)
      .setAudience(this.issuer)
      .setSubject(`agent:${agentUid}`)
      .setIssuedAt(now)
      .setExpirationTime(now + this.ttlSeconds)
      .setJti(newId())
      .sign(this.#privateKey);
    return { access_token: token, token_type: 'Bearer', expires_in: this.ttlSeconds };
  }

  /** True when the token says it is ours (then only this issuer may accept it). */
  claims(token: string): boolean {
    try {
      const payload = JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString()) as { iss?: unknown };
      return payload.iss === this.issuer;
    } catch {
      // Not a JWT we can read: not ours, so the OIDC authenticator judges it (and rejects it).
      return false;
    }
  }

  async authenticate(token: string): Promise<Principal> {
    try {
      const { payload } = await jwtVerify(token, this.#publicKey, {
        issuer: this.issuer,
        audience: this.issuer,
        algorithms: ['ES256'],
        requiredClaims: ['sub', 'exp'],
        clockTolerance: 2,
      });
      const subject = String(payload.sub);
      if (!subject.startsWith('agent:')) throw new AuthenticationError('agent-operator token without an agent subject');
      return {
        kind: 'agent-operator',
        subject,
        orgId: typeof payload.org_id === 'string' ? payload.org_id : '',
        claims: payload,
      };
    } catch (err) {
      if (err instanceof AuthenticationError) throw err;
      throw new AuthenticationError(
        err instanceof joseErrors.JWTExpired ? 'agent-operator token expired' : 'agent-operator token rejected',
        {
          cause: err,
        },
      );
    }
  }
}
