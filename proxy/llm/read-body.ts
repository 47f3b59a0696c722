import type { IncomingMessage } from 'node:http';
import { allocShared } from '../../pipeline/engine.ts';
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
    for await (const chunk of req as AsyncIterable<Buffer>) {
      // More than announced: refuse.
      if (at + chunk.length > announced) throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
      hold?.(chunk.length);
      chunk.copy(out, at);
      at += chunk.length;
    }
    const body = at === announced ? out : out.subarray(0, at);
    spare.set(body, backing.length - body.length);
    return body;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
    hold?.(chunk.length);
    chunks.push(chunk);
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}
