import type { JWK } from 'jose';
import { tokenRequestForm, type ServiceAccountKey } from './service-account-key.ts';
import { IdpError } from '../errors.ts';

// Service accounts live at the OIDC identity provider (they are machine principals of the issuer the
// control plane trusts). The control plane provisions them through the standard surface: dynamic
// client registration (RFC 7591) to create one, its management protocol (RFC 7592) to change its keys
// or remove it. It authenticates to the registration endpoint with its own service-account key
// (`--idp-key`): a client-credentials token requested for the registration endpoint as resource
// (RFC 8707), presented as the initial access token.

export interface Registration {
  client_id: string;
  registration_access_token: string;
  registration_client_uri: string;
}

export interface IdpProvisioner {
  readonly issuer: string;
  register(metadata: Record<string, unknown>): Promise<Registration>;
  update(reg: Registration, metadata: Record<string, unknown>): Promise<void>;
  remove(reg: Registration): Promise<void>;
}

type Fetch = (url: string, init?: RequestInit) => Promise<Response>;

async function answer(res: Response, what: string): Promise<Record<string, unknown>> {
  const text = await res.text();
  let body: Record<string, unknown> = {};
  try {
    body = text ? JSON.parse(text) : {};
  } catch {
    // not JSON: reported by status below
  }
  if (!res.ok)
    throw new IdpError(
      `${what}: HTTP ${res.status}${body.error ? ` ${String(body.error)}${body.error_description ? ` (${String(body.error_description)})` : ''}` : ''}`,
    );
  return body;
}

/** The metadata of a service account's client: client credentials only, authenticated by its keys. */
export function serviceAccountMetadata(name: string, orgId: string, keys: JWK[]): Record<string, unknown> {
  return {
    client_name: name,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'private_key_jwt',
    token_endpoint_auth_signing_alg: 'ES256',
    jwks: { keys },
    org_id: orgId,
  };
}

export class DcrProvisioner implements IdpProvisioner {
  readonly issuer: string;
  #key: ServiceAccountKey;
  #fetch: Fetch;
  #endpoints: { token: string; registration: string } | null = null;
  #token: { value: string; until: number } | null = null;

  constructor(issuer: string, key: ServiceAccountKey, fetchImpl: Fetch) {
    this.issuer = issuer.replace(/\/+$/, '');
    this.#key = key;
    this.#fetch = fetchImpl;
  }

  async #discover(): Promise<{ token: string; registration: string }> {
    if (this.#endpoints) return this.#endpoints;
    let doc: { token_endpoint?: string; registration_endpoint?: string };
    try {
      doc = (await answer(
        await this.#fetch(`${this.issuer}/.well-known/openid-configuration`),
        'IdP discovery',
      )) as typeof doc;
    } catch (err) {
      throw err instanceof IdpError ? err : new IdpError(`IdP discovery: ${(err as Error).message}`);
    }
    if (!doc.token_endpoint || !doc.registration_endpoint)
      throw new IdpError(
        'the IdP does not offer dynamic client registration (no registration_endpoint in its discovery document)',
      );
    this.#endpoints = { token: doc.token_endpoint, registration: doc.registration_endpoint };
    return this.#endpoints;
  }

  async #adminToken(): Promise<{ token: string; registration: string }> {
    const ep = await this.#discover();
    if (this.#token && this.#token.until > Date.now())
      return { token: this.#token.value, registration: ep.registration };
    const body = await answer(
      await this.#fetch(ep.token, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: await tokenRequestForm(this.#key, { resource: ep.registration }),
      }),
      'IdP token for registration',
    );
    if (typeof body.access_token !== 'string') throw new IdpError('IdP token for registration: no access_token');
    const ttl = typeof body.expires_in === 'number' ? body.expires_in : 60;
    this.#token = { value: body.access_token, until: Date.now() + Math.max(0, ttl - 30) * 1000 };
    return { token: body.access_token, registration: ep.registration };
  }

  async register(metadata: Record<string, unknown>): Promise<Registration> {
    const { token, registration } = await this.#adminToken();
    const body = await answer(
      await this.#fetch(registration, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body: JSON.stringify(metadata),
      }),
      'IdP client registration',
    );
    if (
      typeof body.client_id !== 'string' ||
      typeof body.registration_access_token !== 'string' ||
      typeof body.registration_client_uri !== 'string'
    ) {
      throw new IdpError(
        'IdP client registration: the answer lacks client_id, registration_access_token or registration_client_uri',
      );
    }
    return {
      client_id: body.client_id,
      registration_access_token: body.registration_access_token,
      registration_client_uri: body.registration_client_uri,
    };
  }

  async update(reg: Registration, metadata: Record<string, unknown>): Promise<void> {
    await answer(
      await this.#fetch(reg.registration_client_uri, {
        method: 'PUT',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${reg.registration_access_token}` },
        body: JSON.stringify({ ...metadata, client_id: reg.client_id }),
      }),
      'IdP client update',
    );
  }

  async remove(reg: Registration): Promise<void> {
    const res = await this.#fetch(reg.registration_client_uri, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${reg.registration_access_token}` },
    });
    // Already gone at the IdP (401/404 for an unknown client) is what removal wants.
    if (res.ok || res.status === 401 || res.status === 404) return void (await res.text());
    await answer(res, 'IdP client removal');
  }
}
