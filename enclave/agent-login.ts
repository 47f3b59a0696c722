import 'reflect-metadata';
import { createHash, createPrivateKey, createPublicKey, webcrypto } from 'node:crypto';
import { chmod, type FileHandle, link, lstat, mkdir, open, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import * as x509 from '@peculiar/x509';
import { decodeJwt } from 'jose';
import { Agent, request } from 'undici';
import { writeFileAtomic } from '../core/atomic-file.ts';
import { DvxError } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import { AgentLoginInputError, AgentLoginRefusedError, AgentLoginUnavailableError } from './errors.ts';

// `dvx agent-login`: the agent-side helper of the broker's bootstrap and renewal exchanges (spec:
// llm-content-policy, enclave-side agent routes). It redeems the single-use bootstrap token the broker
// wrote onto the agent's host, then renews before the 5-minute JWT runs out, and keeps what it was given
// as files an unmodified SDK can read (docs/agent-login.md):
//
//   DIR/jwt              the platform JWT (no trailing newline)      DIR/refresh-token  the next refresh token
//   DIR/config.json      {config, config_hash}                       DIR/identity.json  {agent_id, org_id, agent_name}
//   DIR/secrets/<name>   one file per secret the agent is served     DIR/cert.pem       identity certificate (--csr)
//   DIR/key.pem          the certificate's P-256 key (--csr; made here, never sent)
//
// Every file is 0600 and replaced atomically, DIR and DIR/secrets are 0700. A refresh token is single use
// and the broker treats a second use as theft (409, the family revoked, the agent suspended), so the new
// one is on disk, fsynced, before anything else is done with an answer, and an exchange in flight is
// finished, never abandoned, when the process is told to stop (docs/decisions.md, "Agent login").

/** Five minutes: the platform JWT's lifetime when its claims do not say. */
const DEFAULT_JWT_LIFETIME_MS = 5 * 60_000;
/** An answer larger than this is not a bundle (secrets and config included). */
const MAX_ANSWER_BYTES = 8 * 1024 * 1024;
const FILE_MODE = 0o600;
const DIR_MODE = 0o700;
const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

export interface AgentLoginOptions {
  /** The broker's agent listener, `https://host:8450`. */
  broker: string;
  /** The bootstrap token file the broker wrote (`<agent-host-dir>/<uid>/bootstrap-token`). */
  tokenFile: string;
  /** Where the identity files go. */
  out: string;
  /** CA bundle trusted for the broker (its certificate is often from a private CA). */
  ca?: Buffer;
  /** Send a CSR of a P-256 key kept under `out`: the bundle then carries a 5-minute identity certificate. */
  csr?: boolean;
  /** One exchange (bootstrap, or a refresh when a refresh token is on disk), then return. */
  once?: boolean;
  log: Logger;
  /** Stops the renewal loop; an exchange in flight is finished first. */
  signal?: AbortSignal;
  /** Renewal window: a random instant in it, or sooner at 80% of the JWT's lifetime. Default 4–5 minutes. */
  renewMinMs?: number;
  renewMaxMs?: number;
  /** Backoff of a retried exchange (doubling, jittered). Default 1 s to 30 s. */
  backoffMinMs?: number;
  backoffMaxMs?: number;
  /** Bound on one exchange (connect, headers, body). Default 30 s. */
  requestTimeoutMs?: number;
  now?: () => number;
}

/** What the last exchange gave, as seen by the caller (tests, the CLI's summary). */
export interface LoginState {
  agentId: string;
  orgId: string;
  agentName: string;
  /** Local time at which the JWT expires (its lifetime counted from its arrival, so clock skew does not matter). */
  jwtExpiresAt: number;
  exchanges: number;
}

interface Bundle {
  jwt: string;
  refresh_token: string;
  secrets: Record<string, string>;
  config: Record<string, unknown>;
  config_hash: string;
  certificate?: string;
  agent_id?: string;
  org_id?: string;
  agent_name?: string;
}

/** The files under DIR. */
export const FILES = {
  jwt: 'jwt',
  refreshToken: 'refresh-token',
  config: 'config.json',
  identity: 'identity.json',
  secrets: 'secrets',
  cert: 'cert.pem',
  key: 'key.pem',
  /** The SHA-256 of the last bootstrap token redeemed: a token file still holding it is not tried again. */
  redeemed: 'bootstrap-token.sha256',
  lock: '.lock',
} as const;

/**
 * A secret name that is safe as one file name under DIR/secrets: no path separator, no NUL or control
 * character, not `.`-led (no `..`, no hidden or temporary file), at most 255 bytes.
 */
export function safeSecretName(name: string): boolean {
  return (
    name.length > 0 &&
    Buffer.byteLength(name) <= 255 &&
    !name.startsWith('.') &&
    !/[/\\]/.test(name) &&
    !/[\u0000-\u001f\u007f]/.test(name)
  );
}

/**
 * When to renew a JWT that lives `lifetimeMs`, counted from its arrival: a random instant in the renewal
 * window (so a fleet started together does not renew together), or at 80% of the JWT's lifetime when that
 * comes first (a short-lived JWT is renewed while it is still good, with time left to retry).
 */
export function renewalDelay(lifetimeMs: number, minMs: number, maxMs: number, random = Math.random()): number {
  return Math.min(minMs + random * (maxMs - minMs), 0.8 * lifetimeMs);
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** A token file holds one token: more than this is not one (and a device file is not read forever). */
const MAX_TOKEN_FILE_BYTES = 64 * 1024;

/** The file's text, trimmed; null when it does not exist. Reads at most MAX_TOKEN_FILE_BYTES + 1 bytes. */
async function readTrimmed(path: string): Promise<string | null> {
  let file: FileHandle;
  try {
    file = await open(path, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
  try {
    const buffer = Buffer.alloc(MAX_TOKEN_FILE_BYTES + 1);
    let length = 0;
    for (;;) {
      const { bytesRead } = await file.read(buffer, length, buffer.length - length, null);
      if (bytesRead === 0 || (length += bytesRead) === buffer.length) break;
    }
    if (length > MAX_TOKEN_FILE_BYTES)
      throw new AgentLoginInputError(`${path} is larger than ${MAX_TOKEN_FILE_BYTES} bytes: not a token file`);
    return buffer.subarray(0, length).toString('utf8').trim();
  } finally {
    await file.close();
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Two agent-logins on one DIR would spend each other's refresh tokens (a replay, to the broker): the
 * second is refused while the first lives. The lock file is linked into place whole, with the holder's
 * pid in it; a lock whose process is gone is taken over.
 */
async function lockDir(dir: string): Promise<() => Promise<void>> {
  const path = join(dir, FILES.lock);
  const tmp = join(dir, `${FILES.lock}.${process.pid}.tmp`);
  await writeFileAtomic(tmp, String(process.pid), { mode: FILE_MODE }).catch(async (err) => {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    await rm(tmp, { force: true });
    await writeFileAtomic(tmp, String(process.pid), { mode: FILE_MODE });
  });
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await link(tmp, path);
        return async () => {
          if ((await readTrimmed(path)) === String(process.pid)) await rm(path, { force: true });
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        const holder = Number(await readTrimmed(path));
        if (Number.isInteger(holder) && holder > 0 && holder !== process.pid && alive(holder))
          throw new AgentLoginInputError(`another dvx agent-login (pid ${holder}) is using ${dir}`);
        await rm(path, { force: true }); // its process is gone: a stale lock
      }
    }
    throw new AgentLoginInputError(`cannot take the lock on ${dir}`);
  } finally {
    await rm(tmp, { force: true });
  }
}

/**
 * Makes `path` a 0700 directory. `owned`: a directory agent-login creates and empties itself (DIR/secrets),
 * which must be a real directory, never a symlink planted there: files are written into it and every
 * entry not served is removed, which through a link would happen wherever it points.
 */
async function ensureDir(path: string, owned = false): Promise<void> {
  try {
    await mkdir(path, { recursive: true, mode: DIR_MODE });
    if (owned && !(await lstat(path)).isDirectory())
      throw new AgentLoginInputError(`${path} is not a directory (a symlink or a file): remove it`);
    await chmod(path, DIR_MODE);
  } catch (err) {
    if (err instanceof AgentLoginInputError) throw err;
    throw new AgentLoginInputError(
      `cannot use ${path} as a private directory: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      { cause: err },
    );
  }
}

/** Runs the writes of `fn` under `dir`; a failure of the file system (full, read-only) is an unusable DIR. */
async function writing<T>(dir: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof DvxError) throw err;
    throw new AgentLoginInputError(
      `cannot write the agent's files under ${dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      { cause: err },
    );
  }
}

/** Writes `data` to `path` (0600, atomically) unless it holds exactly that already. */
async function writeIfChanged(path: string, data: string): Promise<boolean> {
  const current = await readFile(path, 'utf8').catch(() => null); // absent or unreadable: written anew
  if (current === data) {
    // Same content; the mode is still made exact (a file copied in by hand).
    await chmod(path, FILE_MODE);
    return false;
  }
  await writeFileAtomic(path, data, { mode: FILE_MODE });
  return true;
}

/**
 * The broker's Problem detail (never holds a token, by the broker's own rule), or a generic phrase; bounded,
 * and with control characters replaced (it is printed on a terminal).
 */
function problemDetail(text: string): string {
  const clean = (s: string, max: number) => s.slice(0, max).replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
  try {
    const doc = JSON.parse(text) as { detail?: unknown; title?: unknown };
    if (typeof doc.detail === 'string' && doc.detail) return clean(doc.detail, 500);
    if (typeof doc.title === 'string' && doc.title) return clean(doc.title, 200);
  } catch {
    // not a Problem document: said generically below
  }
  return 'no detail';
}

function retryAfterMs(header: unknown, now: number): number | undefined {
  const raw = Array.isArray(header) ? header[0] : header;
  if (typeof raw !== 'string' || !raw) return undefined;
  if (/^\d+$/.test(raw.trim())) return Number(raw.trim()) * 1000;
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** The login helper's run: see `runAgentLogin`. */
export class AgentLogin {
  readonly #o: Required<Omit<AgentLoginOptions, 'ca' | 'signal'>> & Pick<AgentLoginOptions, 'signal'>;
  readonly #dispatcher: Agent;
  readonly #base: string;
  #state: LoginState | null = null;
  /** Local time the last bundle arrived (its JWT's lifetime is counted from here). */
  #receivedAt = 0;

  constructor(options: AgentLoginOptions) {
    let url: URL;
    try {
      url = new URL(options.broker);
    } catch (err) {
      throw new AgentLoginInputError(`--broker "${options.broker}" is not an absolute URL`, { cause: err });
    }
    if (url.protocol !== 'https:')
      throw new AgentLoginInputError('--broker must be an https URL (the broker is TLS only)');
    if (!options.tokenFile) throw new AgentLoginInputError('--token-file is required');
    if (!options.out) throw new AgentLoginInputError('--out is required');
    this.#base = url.origin + url.pathname.replace(/\/+$/, '');
    this.#o = {
      csr: false,
      once: false,
      renewMinMs: 4 * 60_000,
      renewMaxMs: 5 * 60_000,
      backoffMinMs: 1_000,
      backoffMaxMs: 30_000,
      requestTimeoutMs: 30_000,
      now: Date.now,
      ...options,
    };
    if (!(this.#o.renewMinMs > 0) || this.#o.renewMaxMs < this.#o.renewMinMs)
      throw new AgentLoginInputError('the renewal window must be positive and ordered');
    const t = this.#o.requestTimeoutMs;
    this.#dispatcher = new Agent({
      connect: { ...(options.ca ? { ca: options.ca } : {}), timeout: t },
      headersTimeout: t,
      bodyTimeout: t,
    });
  }

  get state(): LoginState | null {
    return this.#state;
  }

  #path(name: string): string {
    return join(this.#o.out, name);
  }

  /**
   * Runs until stopped (the signal) or, with `once`, after one exchange. Throws AgentLoginRefusedError when
   * the broker refuses the agent for good, AgentLoginUnavailableError when it stayed out of reach until the
   * JWT expired, AgentLoginInputError for a missing token file or an unusable DIR.
   */
  async run(): Promise<LoginState | null> {
    const o = this.#o;
    let unlock: () => Promise<void>;
    try {
      await ensureDir(o.out);
      await ensureDir(this.#path(FILES.secrets), true);
      unlock = await lockDir(o.out);
    } catch (err) {
      await this.#dispatcher.close();
      if (err instanceof AgentLoginInputError) throw err;
      throw new AgentLoginInputError(`cannot lock ${o.out}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`, {
        cause: err,
      });
    }
    try {
      // A restart resumes the family on disk (the bootstrap token is single use); until the first answer,
      // the JWT already on disk bounds how long a failing broker is retried.
      if (!(await this.#withRetries(await this.#deadlineOnDisk()))) return this.#state;
      if (o.once || this.#stopped()) return this.#state;
      for (;;) {
        const state = this.#state!;
        const wait = this.#renewalDelay(state);
        o.log.debug({ renew_in_ms: Math.round(wait) }, 'next renewal scheduled');
        if (!(await this.#pause(wait))) return this.#state;
        if (!(await this.#withRetries(state.jwtExpiresAt)) || this.#stopped()) return this.#state;
      }
    } finally {
      await unlock();
      await this.#dispatcher.close();
    }
  }

  #stopped(): boolean {
    return this.#o.signal?.aborted === true;
  }

  /** Waits `ms`; false when stopped meanwhile. */
  async #pause(ms: number): Promise<boolean> {
    if (this.#stopped()) return false;
    try {
      await sleep(Math.max(0, ms), undefined, { signal: this.#o.signal });
      return true;
    } catch {
      return false; // aborted: the process is stopping
    }
  }

  #renewalDelay(state: LoginState): number {
    const o = this.#o;
    const due = renewalDelay(state.jwtExpiresAt - this.#receivedAt, o.renewMinMs, o.renewMaxMs);
    return due - (o.now() - this.#receivedAt);
  }

  /** Until when a failing first exchange is retried: the JWT on disk's expiry, or one JWT lifetime. */
  async #deadlineOnDisk(): Promise<number> {
    const now = this.#o.now();
    const jwt = await readTrimmed(this.#path(FILES.jwt)).catch(() => null); // unreadable: as if absent
    try {
      const exp = jwt ? decodeJwt(jwt).exp : undefined;
      if (typeof exp === 'number' && exp * 1000 > now) return exp * 1000;
    } catch {
      // not a JWT: no bound from it
    }
    return now + DEFAULT_JWT_LIFETIME_MS;
  }

  /**
   * One exchange, retried while the broker is unavailable (with `once`: not retried) until `deadline`.
   * True once it succeeded; false when the run was stopped while waiting to retry.
   */
  async #withRetries(deadline: number): Promise<boolean> {
    const o = this.#o;
    let backoff = o.backoffMinMs;
    for (;;) {
      try {
        await this.#exchange();
        return true;
      } catch (err) {
        if (!(err instanceof AgentLoginUnavailableError) || o.once) throw err;
        const left = deadline - o.now();
        if (left <= 0)
          throw new AgentLoginUnavailableError(`the broker stayed unavailable until the JWT expired: ${err.message}`, {
            cause: err,
          });
        const jittered = backoff * (0.8 + 0.4 * Math.random());
        const wait = Math.min(Math.max(err.retryAfterMs ?? 0, jittered), o.backoffMaxMs, left);
        o.log.warn({ err, retry_in_ms: Math.round(wait) }, 'exchange with the broker failed; retrying');
        if (!(await this.#pause(wait))) return false;
        backoff = Math.min(backoff * 2, o.backoffMaxMs);
      }
    }
  }

  /** One exchange: a refresh when a refresh token is on disk, else (or when its family is dead) a bootstrap. */
  async #exchange(): Promise<void> {
    const refreshToken = await readTrimmed(this.#path(FILES.refreshToken)).catch((err: unknown) => {
      if (err instanceof AgentLoginInputError) throw err;
      throw new AgentLoginInputError(
        `cannot read ${this.#path(FILES.refreshToken)}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`,
        { cause: err },
      );
    });
    if (refreshToken) {
      try {
        return await this.#apply('refresh', await this.#post('/v1/agent/refresh', { refresh_token: refreshToken }));
      } catch (err) {
        // The family is dead (revoked, replayed, expired). An operator's restore re-provisions the agent
        // with a new bootstrap token: one not redeemed before is tried; anything else stands.
        if (!(err instanceof AgentLoginRefusedError) || (err.status !== 401 && err.status !== 409)) throw err;
        const token = await this.#bootstrapToken(false);
        if (!token) throw err;
        this.#o.log.info(
          { refused: err.status },
          'the refresh token family is no longer valid; redeeming the new bootstrap token',
        );
        return this.#bootstrap(token);
      }
    }
    const token = await this.#bootstrapToken(true);
    if (!token)
      throw new AgentLoginRefusedError(
        `the bootstrap token in ${this.#o.tokenFile} was redeemed already and no refresh token is left in ${this.#o.out}: the agent needs to be provisioned again`,
        401,
      );
    return this.#bootstrap(token);
  }

  async #bootstrap(token: string): Promise<void> {
    const body: Record<string, string> = { token };
    const answer = await this.#post('/v1/agent/bootstrap', body);
    // Redeemed: never presented again, whatever happens next.
    await writing(this.#o.out, () =>
      writeFileAtomic(this.#path(FILES.redeemed), `${sha256(token)}\n`, { mode: FILE_MODE }),
    );
    await this.#apply('bootstrap', answer);
  }

  /**
   * The bootstrap token from --token-file; null when it holds the token redeemed last. `required`: a
   * missing or empty file is an input error (else it only means there is no new token).
   */
  async #bootstrapToken(required: boolean): Promise<string | null> {
    const file = this.#o.tokenFile;
    let token: string | null;
    try {
      token = await readTrimmed(file);
    } catch (err) {
      if (err instanceof AgentLoginInputError) throw err;
      throw new AgentLoginInputError(
        `cannot read --token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
        { cause: err },
      );
    }
    if (!token) {
      if (!required) return null;
      throw new AgentLoginInputError(
        token === null
          ? `--token-file ${file} does not exist (the broker writes it once the agent is provisioned)`
          : `--token-file ${file} is empty`,
      );
    }
    if (/\s/.test(token) || token.length > 1024)
      throw new AgentLoginInputError(`--token-file ${file} does not hold one bootstrap token`);
    const redeemed = await readTrimmed(this.#path(FILES.redeemed)).catch(() => null); // unreadable: none known
    return redeemed === sha256(token) ? null : token;
  }

  /** POSTs an exchange with the CSR when asked; the parsed bundle, or a refusal / transient failure. */
  async #post(path: string, body: Record<string, string>): Promise<Bundle> {
    const o = this.#o;
    if (o.csr) body.csr = await this.#csr();
    let status: number;
    let text: string;
    let headers: Record<string, unknown>;
    try {
      const res = await request(`${this.#base}${path}`, {
        method: 'POST',
        dispatcher: this.#dispatcher,
        headers: { 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify(body),
      });
      status = res.statusCode;
      headers = res.headers;
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of res.body) {
        size += (chunk as Buffer).length;
        if (size > MAX_ANSWER_BYTES) {
          res.body.destroy();
          throw new AgentLoginUnavailableError(
            `the broker's answer to ${path} is larger than ${MAX_ANSWER_BYTES} bytes`,
          );
        }
        chunks.push(chunk as Buffer);
      }
      text = Buffer.concat(chunks).toString('utf8');
    } catch (err) {
      if (err instanceof AgentLoginUnavailableError) throw err;
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).name;
      const hint = /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ALTNAME/.test(String(code))
        ? ' (is --ca-cert the CA of the broker?)'
        : '';
      throw new AgentLoginUnavailableError(`cannot reach the broker at ${this.#base}${path}: ${code}${hint}`, {
        cause: err,
      });
    }
    if (status === 200) return this.#parse(path, text);
    const detail = problemDetail(text);
    if (status >= 500 || status === 408 || status === 425 || status === 429)
      throw new AgentLoginUnavailableError(`the broker answered ${status} to ${path}: ${detail}`, {
        retryAfterMs: retryAfterMs(headers['retry-after'], o.now()),
      });
    const why =
      status === 401
        ? 'the token is unknown, used, expired or revoked'
        : status === 403
          ? 'the agent is refused (suspended, isolated or contained)'
          : status === 409
            ? 'a refresh token was used twice: its family is revoked'
            : status === 404
              ? `is --broker the broker's agent listener?`
              : 'the request was rejected';
    throw new AgentLoginRefusedError(`the broker refused ${path} (${status}, ${why}): ${detail}`, status);
  }

  /**
   * The bundle of a 200. Its refresh token is persisted before anything else is checked: the broker has
   * rotated the family already, and the old token is spent.
   */
  async #parse(path: string, text: string): Promise<Bundle> {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      throw new AgentLoginUnavailableError(`the broker's answer to ${path} is not JSON`);
    }
    if (isObject(doc) && typeof doc.refresh_token === 'string' && doc.refresh_token && !/\s/.test(doc.refresh_token)) {
      const token = doc.refresh_token;
      await writing(this.#o.out, () => writeFileAtomic(this.#path(FILES.refreshToken), token, { mode: FILE_MODE }));
    }
    const bad = (what: string) =>
      new AgentLoginUnavailableError(`the broker's answer to ${path} is malformed: ${what}`);
    if (!isObject(doc)) throw bad('not an object');
    if (typeof doc.refresh_token !== 'string' || !doc.refresh_token || /\s/.test(doc.refresh_token))
      throw bad('refresh_token');
    if (typeof doc.jwt !== 'string' || !/^[\w-]+\.[\w-]+\.[\w-]+$/.test(doc.jwt)) throw bad('jwt');
    if (!isObject(doc.secrets) || !Object.values(doc.secrets).every((v) => typeof v === 'string')) throw bad('secrets');
    if (!isObject(doc.config)) throw bad('config');
    if (typeof doc.config_hash !== 'string') throw bad('config_hash');
    if (doc.certificate !== undefined && typeof doc.certificate !== 'string') throw bad('certificate');
    return doc as unknown as Bundle;
  }

  /** Writes an exchange's answer under DIR (the refresh token is there already) and records the state. */
  async #apply(kind: 'bootstrap' | 'refresh', b: Bundle): Promise<void> {
    const o = this.#o;
    let claims: ReturnType<typeof decodeJwt>;
    try {
      claims = decodeJwt(b.jwt);
    } catch (err) {
      throw new AgentLoginUnavailableError(`the broker's ${kind} JWT does not decode`, { cause: err });
    }
    const receivedAt = o.now();
    const lifetimeMs =
      typeof claims.exp === 'number' && typeof claims.iat === 'number' && claims.exp > claims.iat
        ? (claims.exp - claims.iat) * 1000
        : DEFAULT_JWT_LIFETIME_MS;
    const identity = {
      agent_id: b.agent_id ?? String(claims.sub ?? ''),
      org_id: b.org_id ?? String(claims.org_id ?? ''),
      agent_name: b.agent_name ?? String(claims.agent_name ?? ''),
    };
    const { written, removed, skipped } = await writing(o.out, async () => {
      await writeFileAtomic(this.#path(FILES.jwt), b.jwt, { mode: FILE_MODE });
      if (b.certificate) await writeIfChanged(this.#path(FILES.cert), b.certificate);
      const counts = await this.#writeSecrets(b.secrets);
      await writeIfChanged(
        this.#path(FILES.config),
        `${JSON.stringify({ config: b.config, config_hash: b.config_hash }, null, 2)}\n`,
      );
      await writeIfChanged(this.#path(FILES.identity), `${JSON.stringify(identity, null, 2)}\n`);
      return counts;
    });
    this.#receivedAt = receivedAt;
    this.#state = {
      agentId: identity.agent_id,
      orgId: identity.org_id,
      agentName: identity.agent_name,
      jwtExpiresAt: receivedAt + lifetimeMs,
      exchanges: (this.#state?.exchanges ?? 0) + 1,
    };
    o.log.info(
      {
        agent_id: identity.agent_id,
        org_id: identity.org_id,
        secret_names: Object.keys(b.secrets).sort(),
        secrets_written: written,
        secrets_removed: removed,
        secrets_skipped: skipped,
        config_hash: b.config_hash,
        certificate: Boolean(b.certificate),
        jwt_expires_at: new Date(receivedAt + lifetimeMs).toISOString(),
      },
      kind === 'bootstrap' ? 'agent bootstrapped' : 'agent identity renewed',
    );
  }

  /** One file per served secret under DIR/secrets; files of secrets no longer served are removed. */
  async #writeSecrets(secrets: Record<string, string>) {
    const dir = this.#path(FILES.secrets);
    await ensureDir(dir, true);
    let written = 0;
    let removed = 0;
    let skipped = 0;
    const kept = new Set<string>();
    for (const [name, value] of Object.entries(secrets)) {
      if (!safeSecretName(name)) {
        skipped++;
        this.#o.log.warn({ secret_name: JSON.stringify(name) }, 'a secret name is not a safe file name: not written');
        continue;
      }
      kept.add(name);
      if (await writeIfChanged(join(dir, name), value)) written++;
    }
    for (const entry of await readdir(dir)) {
      if (kept.has(entry)) continue;
      await rm(join(dir, entry), { force: true, recursive: true });
      // A temporary file of an interrupted write is not a secret that went away.
      if (!/^\..*\.tmp$/.test(entry)) removed++;
    }
    return { written, removed, skipped };
  }

  /** A CSR of the key under DIR (made on first use, 0600, never sent anywhere). */
  async #csr(): Promise<string> {
    const keyPath = this.#path(FILES.key);
    let pem = await readFile(keyPath, 'utf8').catch(() => null); // absent: made below
    if (pem === null) {
      const pair = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
      const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', pair.privateKey));
      pem = `-----BEGIN PRIVATE KEY-----\n${der
        .toString('base64')
        .replace(/(.{64})/g, '$1\n')
        .replace(/\n?$/, '\n')}-----END PRIVATE KEY-----\n`;
      await writeFileAtomic(keyPath, pem, { mode: FILE_MODE });
    }
    let privateKey: webcrypto.CryptoKey;
    let publicKey: webcrypto.CryptoKey;
    try {
      const key = createPrivateKey(pem);
      privateKey = await webcrypto.subtle.importKey('pkcs8', key.export({ format: 'der', type: 'pkcs8' }), ALG, false, [
        'sign',
      ]);
      publicKey = await webcrypto.subtle.importKey(
        'spki',
        createPublicKey(key).export({ format: 'der', type: 'spki' }),
        ALG,
        true,
        ['verify'],
      );
    } catch (err) {
      throw new AgentLoginInputError(`${keyPath} is not a P-256 private key (remove it to make a new one)`, {
        cause: err,
      });
    }
    const csr = await x509.Pkcs10CertificateRequestGenerator.create({
      name: `CN=${this.#state?.agentId || 'dvx-agent'}`,
      keys: { privateKey, publicKey } as never,
      signingAlgorithm: ALG,
    });
    return csr.toString('pem');
  }
}

/** Runs `dvx agent-login` until stopped; see AgentLogin.run. */
export function runAgentLogin(options: AgentLoginOptions): Promise<LoginState | null> {
  return new AgentLogin(options).run();
}
