import { readFile } from 'node:fs/promises';
import type { Dispatcher } from 'undici';
import { request } from 'undici';
import { parseServiceAccountKey, tokenRequestForm } from '../../controlplane/idp/service-account-key.ts';
import { CliError } from '../errors.ts';
import { EXIT_REFUSED, EXIT_UNAVAILABLE } from '../exit-codes.ts';
import { type ClientSettings, secureTransport } from './client-options.ts';
import { printable } from './output.ts';

// The operator's bearer token: a --token-file read as it is, or minted with --idp-key (spec: "Client
// authentication options"): a private_key_jwt client assertion exchanged by the client credentials grant
// at the token endpoint --issuer's discovery names, for --audience as the resource (RFC 8707) when given.
// A minted token is kept for this process only, and minted again once it is about to expire (a long
// `audit tail` outlives a token).

const TIMEOUT_MS = 15_000;
const MAX_TOKEN_BYTES = 64 * 1024;

export interface TokenSource {
  /** The current token; `fresh` forces a new mint (a stream refused with 401 after its token expired). */
  token(fresh?: boolean): Promise<string>;
}

export function tokenSource(settings: ClientSettings, dispatcher: Dispatcher): TokenSource {
  if (settings.tokenFile) {
    const file = settings.tokenFile;
    return { token: () => readTokenFile(file) };
  }
  if (settings.idpKey) return mintingSource(settings.idpKey, settings.issuer, settings.audience, dispatcher);
  return {
    token: async () => {
      throw new CliError(
        `no credential: give --token-file or --idp-key (with --issuer), or a profile that holds one (dvx profile list)`,
      );
    },
  };
}

async function readTokenFile(file: string): Promise<string> {
  let text: string;
  try {
    text = (await readFile(file, 'utf8')).trim();
  } catch (err) {
    throw new CliError(
      `cannot read --token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  if (!text) throw new CliError(`--token-file ${file} is empty`);
  if (text.length > MAX_TOKEN_BYTES || !/^[\x21-\x7e]+$/.test(text))
    throw new CliError(`--token-file ${file} does not hold one bearer token (printable, no spaces)`);
  return text;
}

function mintingSource(
  keyFile: string,
  issuerFlag: string | undefined,
  audience: string | undefined,
  dispatcher: Dispatcher,
): TokenSource {
  let cached: { value: string; until: number } | null = null;
  return {
    async token(fresh = false) {
      if (!fresh && cached && cached.until > Date.now()) return cached.value;
      let raw: unknown;
      try {
        raw = JSON.parse(await readFile(keyFile, 'utf8'));
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        throw new CliError(
          code ? `cannot read --idp-key ${keyFile}: ${code}` : `--idp-key ${keyFile} is not valid JSON`,
        );
      }
      let key: ReturnType<typeof parseServiceAccountKey>;
      try {
        key = parseServiceAccountKey(raw);
      } catch (err) {
        throw new CliError(`--idp-key ${keyFile}: ${(err as Error).message}`);
      }
      const issuer = (issuerFlag ?? '').replace(/\/+$/, '');
      if (!issuer) throw new CliError('--idp-key needs --issuer (the OIDC issuer that mints the token)');
      if (issuer !== key.issuer.replace(/\/+$/, ''))
        throw new CliError(`--idp-key ${keyFile} belongs to issuer ${key.issuer}, not --issuer ${issuer}`);
      const discovery = await getJson(`${issuer}/.well-known/openid-configuration`, dispatcher, 'issuer discovery');
      const endpoint = (discovery as { token_endpoint?: unknown }).token_endpoint;
      if (typeof endpoint !== 'string' || !/^https?:\/\//i.test(endpoint))
        throw new CliError(`issuer ${issuer}: its discovery document names no token_endpoint`, EXIT_UNAVAILABLE);
      // The client assertion is as good as a token for its minute: never in the clear over a network.
      if (!secureTransport(endpoint))
        throw new CliError(
          `issuer ${issuer}: its token endpoint ${printable(endpoint.slice(0, 200))} is not https; the key's assertion is not sent there`,
          EXIT_UNAVAILABLE,
        );
      const form = await tokenRequestForm(key, audience ? { resource: audience } : {});
      let res: Dispatcher.ResponseData;
      try {
        res = await request(endpoint, {
          method: 'POST',
          dispatcher,
          headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
          body: form.toString(),
          headersTimeout: TIMEOUT_MS,
          bodyTimeout: TIMEOUT_MS,
        });
      } catch (err) {
        throw new CliError(`cannot reach the token endpoint ${endpoint}: ${(err as Error).message}`, EXIT_UNAVAILABLE);
      }
      const body = (await res.body.json().catch(() => ({}))) as Record<string, unknown>;
      if (res.statusCode !== 200 || typeof body.access_token !== 'string') {
        const why = [body.error, body.error_description].filter((v) => typeof v === 'string').join(': ');
        throw new CliError(
          `the issuer refused the token request (${res.statusCode}${why ? ` ${printable(why)}` : ''})`,
          res.statusCode >= 500 ? EXIT_UNAVAILABLE : EXIT_REFUSED,
        );
      }
      // It goes into an Authorization header: anything else would fail every call as "unreachable".
      if (body.access_token.length > MAX_TOKEN_BYTES || !/^[\x21-\x7e]+$/.test(body.access_token))
        throw new CliError(
          `issuer ${issuer}: the token it issued is not a bearer token (printable, no spaces)`,
          EXIT_UNAVAILABLE,
        );
      const ttl = typeof body.expires_in === 'number' && body.expires_in > 0 ? body.expires_in : 60;
      cached = { value: body.access_token, until: Date.now() + Math.max(5, ttl - 30) * 1000 };
      return body.access_token;
    },
  };
}

async function getJson(url: string, dispatcher: Dispatcher, what: string): Promise<unknown> {
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, { dispatcher, headersTimeout: TIMEOUT_MS, bodyTimeout: TIMEOUT_MS });
  } catch (err) {
    throw new CliError(`${what}: cannot reach ${url}: ${(err as Error).message}`, EXIT_UNAVAILABLE);
  }
  if (res.statusCode !== 200) {
    await res.body.dump();
    throw new CliError(`${what}: ${url} answered ${res.statusCode}`, EXIT_UNAVAILABLE);
  }
  try {
    return await res.body.json();
  } catch {
    throw new CliError(`${what}: ${url} did not answer JSON`, EXIT_UNAVAILABLE);
  }
}
