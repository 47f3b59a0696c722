import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { allocShared } from '../../pipeline/engine.ts';
import { copyBytes } from '../../pipeline/shared-bytes.ts';
import { RequestTooLargeError } from './errors.ts';

// Reads a request body up to `limit` bytes. When the length is announced and large, the bytes land
// directly in shared memory, so a pool worker can inspect them without another copy, and with
// `headroom` spare bytes behind them, so the security-context prefix can be spliced in place. That
// shared backing is allocated when the read starts, but the OS commits its pages only as they are
// written (64 backings of 32 MB: resident memory unchanged), so a length announced costs no memory
// until its bytes arrive; the budget of bodies held at once counts them then (`hold`).

const spare = new WeakMap<Buffer, number>();

/** Bytes a body read here may grow by in place (0 for any other buffer). */
export function spareCapacity(body: Buffer): number {
  return spare.get(body) ?? 0;
}

/** The body grown in place to `length` bytes (within its spare capacity), as a new view. */
export function grow(body: Buffer, length: number): Buffer {
  const room = spareCapacity(body);
  if (length - body.length > room) throw new RangeError('no room to grow this body in place');
  const view = Buffer.from(body.buffer, body.byteOffset, length);
  spare.set(view, room - (length - body.length));
  return view;
}

/**
 * `hold`, when given, is told each chunk's length as it arrives, before it is kept (never the announced
 * length: a length announced is not yet in memory). It may throw to refuse the body mid-way (the budget
 * of bodies held at once, core/body-budget.ts); what it was told before stays the caller's to give back.
 * A smaller body that came in several chunks is joined, once all of it is here, into a buffer of its
 * own with `headroom` behind it (not the pool's slab: growing in place must never reach another
 * buffer's bytes), so the prefix's splice moves the body's tail instead of copying the whole body into
 * a second buffer. Nothing is allocated for it before its bytes have arrived.
 */
export async function readBody(
  req: IncomingMessage,
  limit: number,
  sharedFrom: number,
  headroom = 0,
  hold?: (bytes: number) => void,
): Promise<Buffer> {
  const announced = Number(req.headers['content-length']);
  if (Number.isFinite(announced) && announced > limit)
    throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
  if (Number.isFinite(announced) && announced >= sharedFrom) {
    const backing = allocShared(announced + headroom);
    const out = backing.subarray(0, announced);
    let at = 0;
    await eachChunk(req, (chunk) => {
      // More than announced: refuse.
      if (at + chunk.length > announced) throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
      hold?.(chunk.length);
      copyBytes(chunk, out, at);
      at += chunk.length;
    });
    const body = at === announced ? out : out.subarray(0, at);
    spare.set(body, backing.length - body.length);
    return body;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  await eachChunk(req, (chunk) => {
    size += chunk.length;
    if (size > limit) throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
    hold?.(chunk.length);
    chunks.push(chunk);
  });
  if (chunks.length === 1) return chunks[0];
  if (headroom === 0) return Buffer.concat(chunks, size);
  const backing = Buffer.allocUnsafeSlow(size + headroom);
  let at = 0;
  for (const chunk of chunks) at += chunk.copy(backing, at);
  const body = backing.subarray(0, size);
  spare.set(body, headroom);
  return body;
}

/**
 * Feeds each chunk of `stream` to `onChunk` until its end, as `for await` does but without an async
 * iterator, its promise per chunk and its end-of-stream watcher (a body of several chunks pays one
 * turn of the iterator per chunk; one of a single chunk costs about the same either way).
 * The same outcomes: rejects with the stream's error, or when it closes before its end
 * (ERR_STREAM_PREMATURE_CLOSE); when `onChunk` throws, the stream is abandoned as `for await` leaves
 * it (`abandon`) and the promise rejects with what it threw.
 */
export function eachChunk(stream: Readable, onChunk: (chunk: Buffer) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let done = false;
    const settle = (err: Error | null) => {
      if (done) return;
      done = true;
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('close', onClose);
      // The error listener stays: an error after the end is the stream's to report, not the process's.
      if (err) reject(err);
      else resolve();
    };
    const onData = (chunk: Buffer) => {
      if (done) return;
      try {
        onChunk(chunk);
      } catch (err) {
        settle(err as Error);
        abandon(stream);
      }
    };
    const onEnd = () => settle(null);
    const onError = (err: Error) => settle(err);
    const onClose = () => {
      if (!stream.readableEnded) settle(prematureClose());
    };
    if (stream.readableEnded) return resolve();
    if (stream.destroyed) return reject(stream.errored ?? prematureClose());
    stream.on('error', onError);
    stream.on('end', onEnd);
    stream.on('close', onClose);
    stream.on('data', onData);
  });
}

/**
 * Stops reading `stream` as `for await` does when its loop throws (node's internal destroyer): destroyed
 * with an AbortError; a server's request is detached from its socket first, so the connection stays to
 * carry the answer that says why (a 413, a 503 with `connection: close`).
 */
function abandon(stream: Readable): void {
  if (stream.destroyed) return;
  const s = stream as Readable & { _consuming?: unknown; _dumped?: unknown; req?: { upgradeOrConnect?: unknown } };
  if (typeof s._consuming === 'boolean' && typeof s._dumped === 'boolean' && s.req?.upgradeOrConnect === undefined)
    (s as unknown as { socket: unknown }).socket = null;
  stream.destroy(stream.readableEnded ? undefined : new DOMException('The operation was aborted', 'AbortError'));
}

function prematureClose(): Error {
  return Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' });
}
