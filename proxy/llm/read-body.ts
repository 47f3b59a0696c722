import type { IncomingMessage } from 'node:http';
import { allocShared } from '../../pipeline/engine.ts';

// Reads a request body up to `limit` bytes. When the length is announced and large, the bytes land
// directly in shared memory, so a pool worker can inspect them without another copy.

export class TooLargeError extends Error {}

export async function readBody(req: IncomingMessage, limit: number, sharedFrom: number): Promise<Buffer> {
  const announced = Number(req.headers['content-length']);
  if (Number.isFinite(announced) && announced > limit) throw new TooLargeError();
  if (Number.isFinite(announced) && announced >= sharedFrom) {
    const out = allocShared(announced);
    let at = 0;
    for await (const chunk of req as AsyncIterable<Buffer>) {
      if (at + chunk.length > announced) throw new TooLargeError(); // more than announced: refuse
      chunk.copy(out, at);
      at += chunk.length;
    }
    return at === announced ? out : out.subarray(0, at);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new TooLargeError();
    chunks.push(chunk);
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}
