import { Agent, request } from 'undici';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import { coalesced } from '../../core/coalesce.ts';
import type { Logger } from '../../core/logger.ts';
import { SseParser } from '../../core/sse.ts';

// The pull sidecars (`dvx policy-pull`, `dvx config-pull`): fetch the enclave's desired state from the
// control plane with the broker key, write it atomically where the components read it, and pull again
// on every event of the enclave's SSE stream (the nudge) and on an interval (spec: 30 s default). With
// events off, the interval alone. A state that fails validation is not written: the last good one
// stays. Writes happen only when the state changed (its `version` aside).

export interface PullerOptions {
  controlplane: string;
  /** `/v1/broker/snapshot` or `/v1/broker/config`. */
  route: string;
  brokerToken: string;
  out: string;
  intervalMs: number;
  events: boolean;
  ca?: string | Buffer;
  insecureSkipVerify?: boolean;
  /** Throws when the pulled document is not acceptable (the proxy's own snapshot validator). */
  validate?: (doc: unknown) => void;
  log: Logger;
}

export interface RunningPuller {
  /** Resolves after the first successful write (or the first pull that found the file current). */
  ready: Promise<void>;
  pulls(): number;
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
        if (key !== last) {
          await writeFileAtomic(o.out, JSON.stringify(doc, null, 2) + '\n');
          last = key;
          o.log.info({ out: o.out, version: (doc as { version?: string }).version }, 'desired state written');
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
    pending = pull();
    return pending;
  };

  // Not unref'd: with events off, the interval is what keeps the sidecar alive.
  const timer = setInterval(() => void nudge(), o.intervalMs);

  // The nudge: any event on the enclave's stream means "pull again". Reconnects with Last-Event-ID.
  const follow = async () => {
    let cursor: string | null = null;
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
        const parser = new SseParser();
        for await (const chunk of res.body) {
          const events = parser.push(chunk as Buffer);
          for (const e of events) if (e.id) cursor = e.id;
          if (events.length > 0) void nudge();
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
