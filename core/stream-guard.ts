import type { ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { coalesced } from './coalesce.ts';
import type { Logger } from './logger.ts';
import { counter, type Counter } from './metrics.ts';
import { formatSse } from './sse.ts';

// A long-lived stream (the audit tail, the broker events) stays authorized for as long as it runs, not
// only when it opens: it lives exactly as long as the same request, made again now, would be answered.
//
//   open ─▶ timer at the credential's `exp`                          ─▶ end "token_expired"
//        ─▶ every change the component says may matter (`wake`: in the control plane, every change
//           committed by any replica, after the grant cache is dropped) ─▶ recheck() ─▶ end <its reason>
//        ─▶ every recheckMs (a row edited by hand, the LISTEN connection down) ─▶ recheck()
//
// Ending writes one last SSE event, then closes the response (docs/api.md, "Stream end"):
//   event: end
//   data: {"reason":"grant_revoked"}
// A re-check that fails (the store is down) ends the stream too, "authorization_unavailable": a new
// request could not be authorized either, and the client's reconnect finds out when it can.
//
// Every write goes through `write`, which waits for the client to take what was sent (backpressure),
// so a stream never buffers more than a little for a client that does not read. A client that takes
// nothing for `stallMs` (--idle-timeout), or lets more than MAX_BUFFERED_BYTES pile up from writers
// that do not wait (heartbeats), ends the stream: "client_not_reading", the response destroyed (its
// final event could not be read either).

export type StreamEndReason =
  | 'token_expired'
  | 'grant_revoked'
  | 'scope_changed'
  | 'account_disabled'
  | 'key_rotated'
  | 'enclave_deleted'
  | 'authorization_unavailable'
  | 'store_unavailable'
  | 'client_not_reading'
  | 'shutdown';

export interface StreamGuardDeps {
  log: Logger;
  /** How often an open stream re-checks with no change seen in this process. */
  recheckMs: number;
  /** How long a stream may wait for its client to take anything of what was sent (--idle-timeout). */
  stallMs: number;
  ended: Counter<'stream' | 'reason'>;
}

/** `component` names the metric: dvx_<component>_streams_ended_total. */
export function streamGuardDeps(
  registry: Registry,
  log: Logger,
  recheckMs: number,
  stallMs: number,
  component = 'controlplane',
): StreamGuardDeps {
  return {
    log,
    recheckMs,
    stallMs,
    ended: counter(
      registry,
      `dvx_${component}_streams_ended_total`,
      `Long-lived streams the ${component} ended, by stream and reason`,
      ['stream', 'reason'],
    ),
  };
}

export interface GuardedStream {
  /** `audit` or `broker_events`, for metrics and logs. */
  stream: string;
  res: ServerResponse;
  /** Subscribes to the changes that may end the stream (grants committed, a key rotated); returns the unsubscribe. */
  wake?: (recheck: () => void) => () => void;
  /** When the credential expires (ms since the epoch); null when it does not. */
  expiresAt: number | null;
  /** Whether the stream is still authorized: null, or the reason to end it. */
  recheck(): Promise<StreamEndReason | null>;
}

/** setTimeout's ceiling; a later expiry is caught by the periodic re-check. */
const MAX_TIMER_MS = 2_147_483_647;

/** What a stream may hold for its client past node's own buffer, from writes that do not wait. */
export const MAX_BUFFERED_BYTES = 1024 * 1024;

export class StreamGuard {
  readonly #s: GuardedStream;
  readonly #deps: StreamGuardDeps;
  #stopped = false;
  /** The wait for the client to take what was sent, shared by every writer meanwhile. */
  #draining: Promise<boolean> | null = null;
  readonly #cleanup: (() => void)[] = [];

  constructor(s: GuardedStream, deps: StreamGuardDeps) {
    this.#s = s;
    this.#deps = deps;
    const check = coalesced(
      async () => {
        if (this.#stopped) return;
        if (s.expiresAt !== null && s.expiresAt <= Date.now()) return this.end('token_expired');
        let reason: StreamEndReason | null;
        try {
          reason = await s.recheck();
        } catch (err) {
          deps.log.warn({ err, stream: s.stream }, 'stream authorization re-check failed; ending the stream');
          reason = 'authorization_unavailable';
        }
        if (reason) this.end(reason);
      },
      () => this.#stopped,
    );
    if (s.wake) this.#cleanup.push(s.wake(() => void check()));
    const interval = setInterval(() => void check(), deps.recheckMs);
    interval.unref();
    this.#cleanup.push(() => clearInterval(interval));
    if (s.expiresAt !== null) {
      const ms = s.expiresAt - Date.now();
      if (ms <= MAX_TIMER_MS) {
        const timer = setTimeout(() => this.end('token_expired'), Math.max(0, ms));
        timer.unref();
        this.#cleanup.push(() => clearTimeout(timer));
      }
    }
    s.res.once('close', () => this.#stop());
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /**
   * Writes one SSE chunk; resolves true once the client has room for more, false when the stream is
   * over (ended, the client gone, or the client not reading: see the header).
   */
  write(chunk: string): Promise<boolean> {
    const res = this.#s.res;
    if (this.#stopped || res.destroyed) return Promise.resolve(false);
    if (res.writableLength > 0 && res.writableLength + Buffer.byteLength(chunk) > MAX_BUFFERED_BYTES) {
      this.end('client_not_reading');
      return Promise.resolve(false);
    }
    if (res.write(chunk)) return Promise.resolve(true);
    return (this.#draining ??= this.#drained());
  }

  /** Resolves when the response drains; ends the stream when the client takes nothing for stallMs. */
  #drained(): Promise<boolean> {
    const res = this.#s.res;
    return new Promise((resolve) => {
      const done = (ok: boolean) => {
        clearTimeout(timer);
        res.off('drain', drained);
        res.off('close', closed);
        this.#draining = null;
        resolve(ok && !this.#stopped);
      };
      const drained = () => done(true);
      const closed = () => done(false);
      // 'drain' comes only once the whole buffer is gone: a buffer that shrinks is progress too.
      let left = res.writableLength;
      const timer = setTimeout(() => {
        if (res.writableLength < left) {
          left = res.writableLength;
          timer.refresh();
          return;
        }
        this.end('client_not_reading');
        done(false);
      }, this.#deps.stallMs);
      res.on('drain', drained);
      res.on('close', closed);
    });
  }

  /**
   * Ends the stream with its final event (once; a no-op after the client left). A client that is not
   * reading could not read the final event either: its response is destroyed; one whose final event
   * does not get through within stallMs likewise.
   */
  end(reason: StreamEndReason): void {
    if (this.#stopped) return;
    this.#stop();
    this.#deps.ended.inc({ stream: this.#s.stream, reason });
    if (reason !== 'shutdown')
      this.#deps.log.info({ stream: this.#s.stream, reason, unsent_bytes: this.#s.res.writableLength }, 'stream ended');
    const res = this.#s.res;
    if (res.destroyed || res.writableEnded) return;
    if (reason === 'client_not_reading' || res.writableNeedDrain) {
      res.destroy();
      return;
    }
    res.write(formatSse('end', { reason }));
    res.end();
    if (res.writableFinished) return;
    const timer = setTimeout(() => res.destroy(), this.#deps.stallMs);
    timer.unref();
    res.once('close', () => clearTimeout(timer));
  }

  /**
   * Resolves once the response is handed to the OS whole or gone: the server's close waits for it, or
   * it would destroy the connection under a final event still buffered (it did, one run in two).
   */
  settled(): Promise<void> {
    const res = this.#s.res;
    if (res.writableFinished || res.destroyed) return Promise.resolve();
    return new Promise((resolve) => {
      res.once('finish', resolve);
      res.once('close', resolve);
    });
  }

  #stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const fn of this.#cleanup) fn();
  }
}
