import { readFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { exportJWK, generateKeyPair, type JWK } from 'jose';
import Provider from 'oidc-provider';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import { parseAddr } from '../../core/addr.ts';

// `dvx dev`'s OIDC provider (oidc-provider) on loopback, the issuer of every operator token of the
// development system, like `vault server -dev`'s root token:
//
// - the dev admin: a client authenticating with private_key_jwt whose key file (a service-account key,
//   controlplane/idp/service-account-key.ts) the CLI profile `dev` points at (`--idp-key`); its client-
//   credentials tokens carry the demo org as `org_id`;
// - the control plane's own client (`--idp-key` of the control plane), through which it provisions service
//   accounts by dynamic client registration (RFC 7591/7592): its client-credentials token for the
//   registration endpoint (RFC 8707 resource) is accepted as the initial access token, the policy an
//   operator configures on a real IdP for the control plane's account (docs/dev.md).
//
// Its signing key, the two clients' keys and the clients registered dynamically (with their registration
// access tokens) live under DIR, so a second start issues the same way and the control plane's service
// accounts still exist. Development only: nothing here is hardened for a network.

export const DEV_AUDIENCE = 'https://controlplane.dvx.dev';
export const DEV_ADMIN = 'dvx-dev-admin';
export const CONTROLPLANE_CLIENT = 'dvx-controlplane';

export interface DevIssuer {
  issuer: string;
  port: number;
  /** The dev admin's key file (a service-account key: `dvx --idp-key FILE --issuer URL`). */
  adminKeyFile: string;
  /** The control plane's key file (its `--idp-key`). */
  controlplaneKeyFile: string;
  close(): Promise<void>;
}

interface IssuerMaterial {
  signing: JWK;
  admin: JWK;
  controlplane: JWK;
}

async function privateJwk(kid: string): Promise<JWK> {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true });
  return { ...(await exportJWK(privateKey)), kid, alg: 'ES256' };
}

const publicOf = (jwk: JWK): JWK => {
  const { d: _d, ...pub } = jwk;
  return pub;
};

/** The keys under DIR, made on first start. */
async function material(dir: string): Promise<IssuerMaterial> {
  const path = join(dir, 'keys.json');
  try {
    return JSON.parse(await readFile(path, 'utf8')) as IssuerMaterial;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const m: IssuerMaterial = {
    signing: { ...(await privateJwk('dev-issuer-1')), use: 'sig' },
    admin: await privateJwk('dev-admin-1'),
    controlplane: await privateJwk('dev-controlplane-1'),
  };
  await writeFileAtomic(path, JSON.stringify(m), { mode: 0o600 });
  return m;
}

/**
 * oidc-provider's storage: the models a restart must keep (dynamically registered clients and their
 * registration access tokens) in one JSON file under DIR, rewritten atomically on each change; the rest
 * (short-lived access tokens) in memory.
 */
const KEPT = new Set(['Client', 'RegistrationAccessToken']);

class DevStore {
  #path: string;
  #kept: Record<string, Record<string, unknown>> = {};
  #memory = new Map<string, { payload: Record<string, unknown>; expiresAt: number }>();
  #writes: Promise<void> = Promise.resolve();

  constructor(path: string) {
    this.#path = path;
  }

  async load(): Promise<void> {
    try {
      this.#kept = JSON.parse(await readFile(this.#path, 'utf8'));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }

  #save(): Promise<void> {
    const text = JSON.stringify(this.#kept);
    this.#writes = this.#writes.then(() => writeFileAtomic(this.#path, text, { mode: 0o600 }));
    return this.#writes;
  }

  adapter(model: string) {
    const key = (id: string) => `${model}:${id}`;
    const store = this;
    const find = (id: string): Record<string, unknown> | undefined => {
      if (KEPT.has(model)) return store.#kept[key(id)];
      const hit = store.#memory.get(key(id));
      if (!hit) return undefined;
      if (hit.expiresAt && hit.expiresAt < Date.now()) {
        store.#memory.delete(key(id));
        return undefined;
      }
      return hit.payload;
    };
    const all = () =>
      KEPT.has(model)
        ? Object.entries(store.#kept).filter(([k]) => k.startsWith(`${model}:`))
        : [...store.#memory].filter(([k]) => k.startsWith(`${model}:`)).map(([k, v]) => [k, v.payload] as const);
    return {
      async upsert(id: string, payload: Record<string, unknown>, expiresIn?: number) {
        if (KEPT.has(model)) {
          store.#kept[key(id)] = payload;
          await store.#save();
        } else store.#memory.set(key(id), { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : 0 });
      },
      find: async (id: string) => find(id),
      findByUid: async (uid: string) => all().find(([, p]) => p.uid === uid)?.[1],
      findByUserCode: async (code: string) => all().find(([, p]) => p.userCode === code)?.[1],
      async consume(id: string) {
        const p = find(id);
        if (p) p.consumed = Math.floor(Date.now() / 1000);
      },
      async destroy(id: string) {
        if (KEPT.has(model)) {
          delete store.#kept[key(id)];
          await store.#save();
        } else store.#memory.delete(key(id));
      },
      async revokeByGrantId(grantId: string) {
        for (const [k, p] of all()) if (p.grantId === grantId) store.#memory.delete(k);
      },
    };
  }
}

/** Starts the dev issuer on `addr` (host:port, port 0 for any) with its state under `dir`. */
export async function startDevIssuer(options: { dir: string; addr: string; org: string }): Promise<DevIssuer> {
  const m = await material(options.dir);
  const store = new DevStore(join(options.dir, 'clients.json'));
  await store.load();
  const { host, port } = parseAddr(options.addr);
  const server = http.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host || '127.0.0.1', () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  // Plain http: the control plane and the broker accept it on loopback only, where dvx dev keeps it.
  const issuer = `http://${host && host !== '0.0.0.0' ? host : '127.0.0.1'}:${bound}`;
  const registration = `${issuer}/reg`;
  const privateKeyClient = (clientId: string, key: JWK) => ({
    client_id: clientId,
    token_endpoint_auth_method: 'private_key_jwt',
    token_endpoint_auth_signing_alg: 'ES256',
    jwks: { keys: [publicOf(key)] },
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
  });
  const provider = new Provider(issuer, {
    adapter: (model: string) => store.adapter(model),
    clients: [privateKeyClient(DEV_ADMIN, m.admin), privateKeyClient(CONTROLPLANE_CLIENT, m.controlplane)],
    jwks: { keys: [m.signing] },
    clientDefaults: { id_token_signed_response_alg: 'ES256', grant_types: ['client_credentials'], response_types: [] },
    extraClientMetadata: { properties: ['org_id'] },
    clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'private_key_jwt'],
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      registration: { enabled: true, initialAccessToken: true, issueRegistrationAccessToken: true },
      registrationManagement: { enabled: true, rotateRegistrationAccessToken: false },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => DEV_AUDIENCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx: unknown, resource: string) =>
          resource === registration
            ? { scope: 'registration', audience: resource, accessTokenFormat: 'opaque' }
            : { scope: 'api', audience: resource, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'ES256' } } },
      },
    },
    ttl: { ClientCredentials: 600, AccessToken: 600 },
    // The dev admin acts in the demo org; a provisioned service account in the org it was registered for.
    extraTokenClaims: async (ctx: { oidc?: { client?: { clientId?: string; org_id?: string } } }) => ({
      org_id: ctx.oidc?.client?.clientId === DEV_ADMIN ? options.org : (ctx.oidc?.client?.org_id ?? ''),
    }),
  } as never);
  const models = provider as unknown as {
    InitialAccessToken: { find(t: string): Promise<unknown> };
    ClientCredentials: { find(t: string): Promise<{ clientId: string; aud?: string } | undefined> };
  };
  models.InitialAccessToken.find = async (value: string) => {
    const cc = await models.ClientCredentials.find(value);
    return cc && cc.clientId === CONTROLPLANE_CLIENT && cc.aud === registration ? cc : undefined;
  };
  server.on('request', provider.callback());
  // The key files name the issuer's URL, which moves with --issuer-addr: written on every start.
  const keyFile = async (name: string, clientId: string, key: JWK) => {
    const path = join(options.dir, name);
    await writeFileAtomic(
      path,
      JSON.stringify({ type: 'service_account_key', issuer, client_id: clientId, key_id: key.kid, key }, null, 2),
      { mode: 0o600 },
    );
    return path;
  };
  return {
    issuer,
    port: bound,
    adminKeyFile: await keyFile('dev-admin-key.json', DEV_ADMIN, m.admin),
    controlplaneKeyFile: await keyFile('controlplane-key.json', CONTROLPLANE_CLIENT, m.controlplane),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
