import { readFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import { parseServiceAccountKey, tokenRequestForm } from '../../controlplane/idp/service-account-key.ts';
import { CliError } from '../errors.ts';

// The dev admin's HTTP calls while `dvx dev` sets the system up: its token minted with its key file the
// way `dvx --idp-key` mints it (client credentials, private_key_jwt), then JSON calls to the control plane
// and the broker's operator listener, which both trust the dev issuer.

export interface Answer {
  status: number;
  /** The parsed JSON body (its shape is the route's), or the text when it is not JSON. */
  // biome-ignore lint/suspicious/noExplicitAny: an answer's shape is the route's; the callers read the fields they asked for
  body: any;
}

export class DevApi {
  #dispatcher: Agent;
  #keyFile: string;
  #issuer: string;
  #audience: string;
  #token: { value: string; until: number } | null = null;

  constructor(options: { ca: string; keyFile: string; issuer: string; audience: string }) {
    this.#dispatcher = new Agent({ connect: { ca: options.ca } });
    this.#keyFile = options.keyFile;
    this.#issuer = options.issuer;
    this.#audience = options.audience;
  }

  async #bearer(): Promise<string> {
    if (this.#token && this.#token.until > Date.now()) return this.#token.value;
    const key = parseServiceAccountKey(JSON.parse(await readFile(this.#keyFile, 'utf8')));
    const form = await tokenRequestForm(key, { resource: this.#audience });
    const res = await request(`${this.#issuer}/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: form.toString(),
    });
    const body = (await res.body.json()) as { access_token?: string; expires_in?: number; error?: string };
    if (res.statusCode !== 200 || !body.access_token)
      throw new CliError(
        `dvx dev: the dev issuer refused the dev admin's token (${res.statusCode} ${body.error ?? ''})`,
      );
    this.#token = { value: body.access_token, until: Date.now() + ((body.expires_in ?? 60) - 30) * 1000 };
    return body.access_token;
  }

  /** A JSON call; the status and parsed body (a text body as it is). */
  async call(method: string, url: string, body?: unknown): Promise<Answer> {
    const res = await request(url, {
      method: method as 'GET',
      dispatcher: this.#dispatcher,
      headers: {
        authorization: `Bearer ${await this.#bearer()}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.body.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      // not JSON: kept as text for the error message
    }
    return { status: res.statusCode, body: parsed };
  }

  /** A call that must answer one of `ok`; otherwise a CliError naming the step and the Problem. */
  async must(what: string, ok: number[], method: string, url: string, body?: unknown): Promise<Answer> {
    const a = await this.call(method, url, body);
    if (!ok.includes(a.status)) {
      const detail =
        a.body && typeof a.body === 'object' ? (a.body.detail ?? a.body.title ?? JSON.stringify(a.body)) : a.body;
      throw new CliError(`dvx dev: ${what} failed: ${a.status} ${String(detail).slice(0, 300)}`);
    }
    return a;
  }

  close(): Promise<void> {
    return this.#dispatcher.close();
  }
}
