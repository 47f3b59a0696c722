import { Agent, request } from 'undici';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import { coalesced } from '../../core/coalesce.ts';
import type { Logger } from '../../core/logger.ts';
import { SseParser } from '../../core/sse.ts';

// The pull sidecars (`dvx policy-pull`, `dvx config-pull`): fetch the enclave's desired state from the
// control plane with the broker key, write it atomically where the components read it, and pull again
// on every event of the enclave's SSE stream (the nudge) and on an interval (spec: 30 s default). With
// events off, the interval alone. A state that fails validation is not written: the last good one
// stays. Writes happen only when the state changed (its `version` aside). The broker runs the same
// puller without (or with) a file: `onDocument` hands it each validated state, `lastEventId` and
// `onCursor` keep its place in the event stream across restarts, and `onNudge` tells it the stream
// asked for a pull (so its other puller pulls too).

export interface PullerOptions {
  controlplane: string;
  /** `/v1/broker/snapshot` or `/v1/broker/config`. */
  route: string;
  brokerToken: string;
  /** Where the state is written; empty: not written (onDocument alone). */
  out: string;
  intervalMs: number;
  events: boolean;
  ca?: string | Buffer;
  insecureSkipVerify?: boolean;
  /** Throws when the pulled document is not acceptable (the proxy's own snapshot validator). */
  validate?: (doc: unknown) => void;
  /** Each validated state, on every pull; a throw is logged and `ready` waits for a pull it accepts. */
  onDocument?: (doc: unknown) => Promise<void> | void;
  /** The event stream's cursor to resume from (Last-Event-ID), e.g. kept across restarts. */
  lastEventId?: string | null;
  /** The cursor moved: the id of the last event of a batch the stream delivered. */
  onCursor?: (id: string) => void;
  /** The event stream asked for a pull (it connected, or events arrived). */
  onNudge?: () => void;
  log: Logger;
}

export interface RunningPuller {
  /** Resolves after the first pull written (or found current) and accepted by onDocument. */
  ready: Promise<void>;
  pulls(): number;
  /** Pulls now (coalesced with a pull in flight). */
  nudge(): Promise<void>;
  close(): Promise<void>;
}

const withoutVersion = (doc: unknown) => JSON.stringify({ ...(doc as object), version: undefined });

export function startPuller(o: PullerOptions): RunningPuller {
  const base = o.controlplane.replace(/\/+$/, '');
  const dispatcher = new Agent({
    connect: { ...(o.ca ? { ca: o.ca } : {}), rejectUnauthorized: !o.insecureSkipVerify },
  });
  const headers = { authorization: `Bearer ${o.brokerToken}` };
  let closed = false;
  let last: string | null = null;
  let count = 0;
  let markReady: () => void = () => {};
  const ready = new Promise<void>((r) => (markReady = r));
  let stream: AbortController | null = null;

  // One pull at a time; a nudge during a pull makes it pull once more.
  const pull = coalesced(
    async () => {
      try {
        const res = await request(`${base}${o.route}`, { dispatcher, headers });
        const text = await res.body.text();
        if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`);
        const doc = JSON.parse(text) as unknown;
        o.validate?.(doc);
        count++;
        const key = withoutVersion(doc);
        if (o.out && key !== last) {
          await writeFileAtomic(o.out, JSON.stringify(doc, null, 2) + '\n');
          last = key;
          o.log.info({ out: o.out, version: (doc as { version?: string }).version }, 'desired state written');
        }
        if (o.onDocument) {
          try {
            await o.onDocument(doc);
          } catch (err) {
            o.log.warn({ err, route: o.route }, 'the pulled state could not be applied; trying again on the next pull');
            return;
          }
        }
        markReady();
      } catch (err) {
        o.log.warn({ err, route: o.route }, 'pull failed; keeping the last good state');
      }
    },
    () => closed,
  );
  let pending: Promise<void> | null = null;
  const nudge = () => {
    if (closed) return Promise.resolve();
    pending = pull();
    return pending;
  };

  // Not unref'd: with events off, the interval is what keeps the sidecar alive.
  const timer = setInterval(() => void nudge(), o.intervalMs);

  // The nudge: any event on the enclave's stream means "pull again". Reconnects with Last-Event-ID.
  const follow = async () => {
    let cursor: string | null = o.lastEventId || null;
    let backoff = 250;
    while (!closed) {
      stream = new AbortController();
      try {
        const res = await request(`${base}/v1/broker/events`, {
          dispatcher,
          signal: stream.signal,
          headers: { ...headers, ...(cursor ? { 'last-event-id': cursor } : {}) },
        });
        if (res.statusCode !== 200) {
          await res.body.dump();
          throw new Error(`events: HTTP ${res.statusCode}`);
        }
        backoff = 250;
        void nudge(); // whatever happened while disconnected
        o.onNudge?.();
        const parser = new SseParser();
        for await (const chunk of res.body) {
          const events = parser.push(chunk as Buffer);
          const before = cursor;
          for (const e of events) if (e.id) cursor = e.id;
          if (cursor && cursor !== before) o.onCursor?.(cursor);
          if (events.length > 0) {
            void nudge();
            o.onNudge?.();
          }
        }
      } catch (err) {
        if (closed) return;
        o.log.warn({ err }, 'event stream dropped; reconnecting');
      }
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 10_000);
    }
  };

  void nudge();
  if (o.events) void follow();
  return {
    ready,
    pulls: () => count,
    nudge,
    async close() {
      closed = true;
      clearInterval(timer);
      stream?.abort();
      // Closing: a pull in flight has logged its own failure, and a dispatcher that fails to close
      // holds nothing this process still needs.
      await pending?.catch(() => {});
      await dispatcher.destroy().catch(() => {});
    },
  };
}
