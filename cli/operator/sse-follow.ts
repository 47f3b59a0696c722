import { setTimeout as sleep } from 'node:timers/promises';
import { type Dispatcher, request } from 'undici';
import { type SseEvent, SseParser } from '../../core/sse.ts';
import { CliError } from '../errors.ts';
import { EXIT_UNAVAILABLE } from '../exit-codes.ts';
import { printable } from './output.ts';
import { type CallSpec, type OperatorClient, problemAnswer, unreachable } from './operator-client.ts';

// Following a server-sent-event stream (`dvx audit tail`, `dvx approvals watch`): the stream is read
// until the operator stops it; when it ends or breaks it is opened again with `Last-Event-ID` set to the
// last event received, so nothing between the two connections is lost and nothing is shown twice. A
// token that expired on the way (the servers end a stream at its token's expiry) is minted again.
// Refusals that reconnecting cannot cure (400, 403, 404) end the command with their error.

const MAX_BACKOFF_MS = 30_000;
const FIRST_BACKOFF_MS = 500;
/** A connection that stays silent this long (the servers send heartbeats far more often) is dead. */
const IDLE_MS = 90_000;
/** One event's bytes at most: a server that never ends an event must not grow the follower without bound. */
export const MAX_EVENT_BYTES = 8 * 1024 * 1024;
/** What a Last-Event-ID header can carry back (undici refuses anything else, which would loop as "unreachable"). */
const SENDABLE_ID = /^[\x20-\x7e]{0,1024}$/;

export interface FollowOptions {
  signal: AbortSignal;
  /** Called with each event that carries data; awaited, so a slow consumer slows the stream, never drops. */
  onEvent(event: SseEvent): void | Promise<void>;
  /** A note for the operator (reconnecting, resumed); shown on stderr. */
  onNote?(note: string): void;
  /** Resume after this event id (a previous run's last). */
  lastEventId?: string;
}

export async function follow(
  client: OperatorClient,
  spec: Omit<CallSpec, 'method' | 'body'>,
  o: FollowOptions,
): Promise<void> {
  let lastId = o.lastEventId;
  let backoff = FIRST_BACKOFF_MS;
  let freshToken = false;
  let retriedAuth = false;
  let toldNoIds = false;
  const url = client.url(spec);
  while (!o.signal.aborted) {
    if (lastId !== undefined && !SENDABLE_ID.test(lastId))
      throw new CliError(
        `the stream's event id ${JSON.stringify(printable(lastId.slice(0, 80)))} cannot be sent back as Last-Event-ID: cannot resume`,
        EXIT_UNAVAILABLE,
      );
    const token = await client.tokens.token(freshToken);
    freshToken = false;
    let res: Dispatcher.ResponseData;
    try {
      res = await request(url, {
        method: 'GET',
        dispatcher: client.dispatcher,
        signal: o.signal,
        headersTimeout: 30_000,
        bodyTimeout: IDLE_MS,
        headers: {
          accept: 'text/event-stream',
          authorization: `Bearer ${token}`,
          ...spec.headers,
          ...(lastId ? { 'last-event-id': lastId } : {}),
        },
      });
    } catch (err) {
      if (o.signal.aborted) return;
      // A request undici refuses to send (a header it will not carry) fails the same way every time.
      if ((err as { code?: string }).code === 'UND_ERR_INVALID_ARG')
        throw new CliError(`cannot send the request to ${url}: ${(err as Error).message}`, EXIT_UNAVAILABLE);
      const e = unreachable(url, err);
      if (/TLS certificate/.test(e.message)) throw e; // reconnecting does not fix trust
      o.onNote?.(`${e.message}; reconnecting in ${Math.round(backoff / 1000) || 1}s`);
      await pause(backoff, o.signal);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      continue;
    }
    if (res.statusCode !== 200) {
      const text = await res.body.text().catch(() => '');
      let body: unknown = text;
      try {
        body = JSON.parse(text);
      } catch {}
      // 401 once: the token may have expired between mints; a second 401 is a real refusal.
      if (res.statusCode === 401 && !retriedAuth) {
        retriedAuth = true;
        freshToken = true;
        continue;
      }
      if (res.statusCode >= 500 || res.statusCode === 429) {
        o.onNote?.(`the stream answered ${res.statusCode}; reconnecting in ${Math.round(backoff / 1000) || 1}s`);
        await pause(backoff, o.signal);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
        continue;
      }
      throw problemAnswer(res.statusCode, body);
    }
    if (!/text\/event-stream/i.test(String(res.headers['content-type'] ?? ''))) {
      await res.body.dump();
      throw new CliError(`${url} did not answer an event stream`, EXIT_UNAVAILABLE);
    }
    const parser = new SseParser();
    let delivered = false;
    let pending = 0; // bytes since the last whole event
    try {
      for await (const chunk of res.body) {
        pending += (chunk as Buffer).length;
        const events = parser.push(chunk as Buffer);
        if (events.length > 0) pending = 0;
        else if (pending > MAX_EVENT_BYTES) {
          res.body.destroy();
          // Reconnecting would fetch the same event again.
          throw new CliError(`an event of ${url} is larger than ${MAX_EVENT_BYTES} bytes`, EXIT_UNAVAILABLE);
        }
        for (const event of events) {
          if (event.id !== undefined) lastId = event.id;
          if (event.data === '') continue;
          await o.onEvent(event);
          if (!delivered) {
            delivered = true;
            backoff = FIRST_BACKOFF_MS;
            retriedAuth = false;
          }
        }
      }
    } catch (err) {
      if (o.signal.aborted) return;
      if (err instanceof CliError) throw err;
      o.onNote?.(`the stream broke (${(err as Error).message}); resuming${lastId ? ` after ${lastId}` : ''}`);
    }
    if (o.signal.aborted) return;
    if (delivered && lastId === undefined && !toldNoIds) {
      toldNoIds = true;
      o.onNote?.('the stream sent no event id: events between this connection and the next may be lost or repeated');
    }
    // The server ended the stream (a restart, the token's expiry, a grant re-check): open it again.
    freshToken = true;
    retriedAuth = false;
    await pause(delivered ? FIRST_BACKOFF_MS : backoff, o.signal);
    if (!delivered) backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
  }
}

async function pause(ms: number, signal: AbortSignal): Promise<void> {
  try {
    await sleep(ms, undefined, { signal });
  } catch {}
}
