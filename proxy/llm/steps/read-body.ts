import { DEFAULT_INLINE_THRESHOLD_BYTES, MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal, RequestTooLargeError } from '../errors.ts';
import { readBody as read } from '../read-body.ts';
import { securityPrefix } from './prefix.ts';

// The request body, up to 32 MB (spec: llm-content-policy, "Errors": 413 past it). An inference body
// that keeps its format is read with room for the security-context prefix, JSON-escaped, plus the
// wrapper around it, so the prefix step splices it in place.

const CLOSE = { connection: 'close' };

export async function readBody(ctx: CallContext): Promise<void> {
  const inPlace = ctx.inference && ctx.upstreamFormat === ctx.format;
  const headroom = inPlace ? Buffer.byteLength(JSON.stringify(securityPrefix(ctx))) + 64 : 0;
  ctx.reading = true;
  try {
    ctx.body = await read(ctx.req, MAX_BODY_BYTES, DEFAULT_INLINE_THRESHOLD_BYTES, headroom);
  } catch (err) {
    if (err instanceof RequestTooLargeError) throw new Refusal(ERRORS.tooLarge, 'request body exceeds 32 MB', CLOSE);
    throw err;
  }
  ctx.requestBytes = ctx.body.length;
  ctx.d.metrics.requestBytes.observe({ format: ctx.format! }, ctx.body.length);
}
