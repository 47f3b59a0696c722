import type { IncomingMessage } from 'node:http';
import { allocShared } from '../../pipeline/engine.ts';
import { RequestTooLargeError } from './errors.ts';

// Reads a request body up to `limit` bytes. When the length is announced and large, the bytes land
// directly in shared memory, so a pool worker can inspect them without another copy, and with
// `headroom` spare bytes behind them, so the security-context prefix can be spliced in place.

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
 * `hold`, when given, is told the bytes the body will hold before they are held: the announced length
 * before anything is read, or each chunk's length as it comes when none was announced. It may throw to
 * refuse the body (the gateway's budget of bodies held at once, core/body-budget.ts).
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
  if (Number.isFinite(announced)) hold?.(announced);
  if (Number.isFinite(announced) && announced >= sharedFrom) {
    const backing = allocShared(announced + headroom);
    const out = backing.subarray(0, announced);
    let at = 0;
    for await (const chunk of req as AsyncIterable<Buffer>) {
      // More than announced: refuse.
      if (at + chunk.length > announced) throw new RequestTooLargeError(`request body exceeds ${limit} bytes`);
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
    if (!Number.isFinite(announced)) hold?.(chunk.length);
    chunks.push(chunk);
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}
