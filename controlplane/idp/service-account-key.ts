import { importJWK, SignJWT, type JWK } from 'jose';
import { newId } from '../../core/ids.ts';
import { KeyFileError } from '../errors.ts';

// A service-account key file: what `--idp-key` points at, and what the service-account routes hand out
// once as secret material. The holder mints its own token: a private_key_jwt client assertion (RFC 7523
// §2.2) signed with the key, exchanged for an access token by the client credentials grant at the
// issuer's token endpoint (or through the control plane's POST /oauth/token facade).
//
//   {"type": "service_account_key", "issuer": URL, "client_id": str, "key_id": str, "key": private JWK}

export interface ServiceAccountKey {
  type: 'service_account_key';
  issuer: string;
  client_id: string;
  key_id: string;
  key: JWK;
}

export function parseServiceAccountKey(raw: unknown): ServiceAccountKey {
  const k = raw as Partial<ServiceAccountKey> | null;
  if (!k || typeof k !== 'object') throw new KeyFileError('a service-account key file is a JSON object');
  if (k.type !== 'service_account_key') throw new KeyFileError('type must be "service_account_key"');
  for (const f of ['issuer', 'client_id', 'key_id'] as const)
    if (typeof k[f] !== 'string' || !k[f]) throw new KeyFileError(`${f} is required`);
  if (!k.key || typeof k.key !== 'object' || typeof k.key.d !== 'string')
    throw new KeyFileError('key must be a private JWK');
  return k as ServiceAccountKey;
}

/** A one-minute client assertion for `audience` (the issuer identifier or its token endpoint). */
export async function clientAssertion(key: ServiceAccountKey, audience: string): Promise<string> {
  const alg = key.key.alg ?? 'ES256';
  return new SignJWT({})
    .setProtectedHeader({ alg, kid: key.key_id, typ: 'JWT' })
    .setIssuer(key.client_id)
    .setSubject(key.client_id)
    .setAudience(audience)
    .setJti(newId())
    .setIssuedAt()
    .setExpirationTime('60s')
    .sign(await importJWK(key.key, alg));
}

/** The token-request form of the client credentials grant authenticated by the key. */
export async function tokenRequestForm(
  key: ServiceAccountKey,
  extra: Record<string, string> = {},
): Promise<URLSearchParams> {
  return new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: key.client_id,
    client_assertion_type: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer',
    client_assertion: await clientAssertion(key, key.issuer),
    ...extra,
  });
}
