import { readFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import { coalesced } from '../../core/coalesce.ts';
import type { Logger } from '../../core/logger.ts';
import { SseParser } from '../../core/sse.ts';
import { OptionsError, SecretBrokerError } from './errors.ts';
import type { SecretMap } from './secrets-file.ts';

// The enclave broker as llmproxy's secret source (`--secret-broker-url`): an in-memory copy of the
// broker's `GET /v1/satellite/secrets`, authenticated with the satellite token the broker issues
// (`--secret-broker-token-file`; never an agent's JWT), mapped onto the proxy's SecretMap:
//
//   agents: {uid: {name: value}}  →  `agent:<uid>`  the agent's secrets merged org → group → agent
//   orgs:   {org: {name: value}}  →  `org:<org>`    the org's own
//
// The copy is fetched at start, again on every `secrets` event of `GET /v1/satellite/events` whose
// version differs from the copy's (the stream reconnects with backoff), and every 30 s as a
// safety net. A fetch that fails keeps the last good copy and says so in the log.
//
// A broker that cannot be reached at start does not stop the proxy (docs/decisions.md, "The enclave's
// secrets"): it serves at once, every platform-credential call answering the spec's `no LLM API
// credential configured` and the secrets filter holding no needles, with an error logged on every
// failed attempt, until the first fetch succeeds. Values never reach a log line: lines name versions.

export interface SecretBrokerOptions {
  /** The broker's agent base URL (https). */
  url: string;
  tokenFile: string;
  /** CA bundle trusted for the broker. */
  ca?: Buffer;
  log: Logger;
  /** The safety-net refetch period. */
  refreshMs?: number;
  /** An events stream silent this long is dropped and reopened (the broker heartbeats every 30 s). */
  streamIdleMs?: number;
}

const REQUEST_TIMEOUT_MS = 10_000;
const MAX_BACKOFF_MS = 10_000;

/** The satellite token of --secret-broker-token-file (also --approvals-url's); a missing or empty file refuses. */
export async function readSatelliteToken(path: string): Promise<string> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new OptionsError(
      `cannot read --secret-broker-token-file ${path}: ${(err as NodeJS.ErrnoException).code ?? 'unreadable'}`,
      { cause: err },
    );
  }
  const token = text.trim();
  if (!token) throw new OptionsError(`--secret-broker-token-file ${path} is empty`);
  return token;
}

const isRecord = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The broker's document as a SecretMap and its version; throws naming what is wrong (never a value). */
export function parseSatelliteSecrets(doc: unknown): { version: number; map: SecretMap } {
  if (!isRecord(doc)) throw new SecretBrokerError('the satellite secrets are not a JSON object');
  const { version, agents, orgs } = doc;
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 0)
    throw new SecretBrokerError('the satellite secrets lack a version');
  const map: SecretMap = new Map();
  for (const [kind, owners] of [
    ['agent', agents],
    ['org', orgs],
  ] as const) {
    if (!isRecord(owners)) throw new SecretBrokerError(`the satellite secrets lack "${kind}s"`);
    for (const [owner, entries] of Object.entries(owners)) {
      if (!isRecord(entries))
        throw new SecretBrokerError(`the satellite secrets of ${kind} ${owner} are not an object`);
      const names = new Map<string, string>();
      for (const [name, value] of Object.entries(entries)) {
        if (typeof value !== 'string')
          throw new SecretBrokerError(`the satellite secret ${name} of ${kind} ${owner} is not a string`);
        names.set(name, value);
      }
      map.set(`${kind}:${owner}`, names);
    }
  }
  return { version, map };
}

export class SecretBroker {
  readonly #o: Required<Omit<SecretBrokerOptions, 'ca'>>;
  readonly #dispatcher: Agent;
  #token: string;
  #map: SecretMap = new Map();
  #version: number | null = null;
  #closed = false;
  #failures = 0;
  #stream: AbortController | null = null;
  #wake: (() => void) | null = null;
  #timer: NodeJS.Timeout | null = null;
  #following: Promise<void> | null = null;
  readonly #fetch: () => Promise<void>;

  /** Reads the token (a missing or empty file refuses the start), fetches once, then follows the broker. */
  static async start(o: SecretBrokerOptions): Promise<SecretBroker> {
    const broker = new SecretBroker(o, await readSatelliteToken(o.tokenFile));
    await broker.#fetch();
    broker.#timer = setInterval(() => void broker.#fetch(), broker.#o.refreshMs);
    broker.#timer.unref();
    broker.#following = broker.#follow();
    return broker;
  }

  private constructor(o: SecretBrokerOptions, token: string) {
    this.#o = { refreshMs: 30_000, streamIdleMs: 75_000, ...o };
    this.#token = token;
    this.#dispatcher = new Agent({ connect: o.ca ? { ca: o.ca } : {} });
    this.#fetch = coalesced(
      () => this.#fetchOnce(),
      () => this.#closed,
    );
  }

  /** The secrets as last fetched (empty until the first fetch succeeded). */
  get map(): SecretMap {
    return this.#map;
  }

  /** The version of the copy held; null before the first fetch succeeded. */
  get version(): number | null {
    return this.#version;
  }

  #headers() {
    return { authorization: `Bearer ${this.#token}` };
  }

  /** A 401: the token file may hold a new token (the broker's was replaced); read it again. */
  async #refused(): Promise<void> {
    try {
      this.#token = await readSatelliteToken(this.#o.tokenFile);
    } catch (err) {
      this.#o.log.error({ err }, 'secret broker: the satellite token file cannot be read again');
    }
  }

  async #fetchOnce(): Promise<void> {
    const { log, url } = this.#o;
    try {
      const res = await request(`${url}/v1/satellite/secrets`, {
        dispatcher: this.#dispatcher,
        headers: this.#headers(),
        headersTimeout: REQUEST_TIMEOUT_MS,
        bodyTimeout: REQUEST_TIMEOUT_MS,
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        if (res.statusCode === 401) await this.#refused();
        throw new SecretBrokerError(`the broker answered ${res.statusCode} to GET /v1/satellite/secrets`);
      }
      const { version, map } = parseSatelliteSecrets(await res.body.json());
      if (this.#closed) return;
      const first = this.#version === null;
      this.#map = map;
      this.#version = version;
      if (first || this.#failures > 0) log.info({ version, owners: map.size }, 'secrets loaded from the secret broker');
      else log.debug({ version, owners: map.size }, 'secrets reloaded from the secret broker');
      this.#failures = 0;
    } catch (err) {
      if (this.#closed) return;
      this.#failures++;
      if (this.#version === null)
        log.error(
          { err, url, failures: this.#failures },
          'secret broker unreachable: no platform credential and no secrets-filter needles until it answers',
        );
      else
        log.warn(
          { err, url, version: this.#version, failures: this.#failures },
          'secret broker fetch failed; keeping the last good secrets',
        );
    }
  }

  /** The events stream: any `secrets` event naming another version than the copy's fetches again. */
  async #follow(): Promise<void> {
    const { log, url } = this.#o;
    let backoff = 250;
    while (!this.#closed) {
      this.#stream = new AbortController();
      try {
        const res = await request(`${url}/v1/satellite/events`, {
          dispatcher: this.#dispatcher,
          signal: this.#stream.signal,
          headers: { ...this.#headers(), accept: 'text/event-stream' },
          headersTimeout: REQUEST_TIMEOUT_MS,
          bodyTimeout: this.#o.streamIdleMs,
        });
        if (res.statusCode !== 200) {
          await res.body.dump();
          if (res.statusCode === 401) await this.#refused();
          throw new SecretBrokerError(`the broker answered ${res.statusCode} to GET /v1/satellite/events`);
        }
        backoff = 250;
        const parser = new SseParser();
        for await (const chunk of res.body) {
          for (const e of parser.push(chunk as Buffer)) {
            if (e.event !== 'secrets') continue;
            let version: unknown = null;
            try {
              version = (JSON.parse(e.data) as { version?: unknown }).version;
            } catch {
              // Not a version: fetch, which finds out what the broker holds.
            }
            if (version !== this.#version) void this.#fetch();
          }
        }
        if (!this.#closed) log.info('secret broker events stream ended; reconnecting');
      } catch (err) {
        if (this.#closed) return;
        log.warn({ err, url }, 'secret broker events stream dropped; reconnecting');
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, backoff);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = null;
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#stream?.abort();
    this.#wake?.();
    await this.#following;
    await this.#dispatcher.destroy();
  }
}
