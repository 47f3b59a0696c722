import { DEFAULT_INLINE_THRESHOLD_BYTES, MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, OverloadedError, Refusal, RequestTooLargeError } from '../errors.ts';
import { readBody as read } from '../read-body.ts';
import { securityPrefix } from './prefix.ts';

// The request body, up to 32 MB (spec: llm-content-policy, "Errors": 413 past it). An inference body
// that keeps its format is read with room for the security-context prefix, JSON-escaped, plus the
// wrapper around it, so the prefix step splices it in place. The body is taken from the bodies held at
// once (--max-buffered-bodies, core/body-budget.ts) until the call ends: one that does not fit is answered
// 503 overloaded_error with retry-after, before it is read when its length is announced (the body is
// then drained, the connection kept), else as soon as it passes the budget (the connection closed).

const CLOSE = { connection: 'close' };
const RETRY = { 'retry-after': '1' };
const RETRY_CLOSE = { 'retry-after': '1', connection: 'close' };

export async function readBody(ctx: CallContext): Promise<void> {
  const inPlace = ctx.inference && ctx.upstreamFormat === ctx.format;
  const headroom = inPlace ? Buffer.byteLength(JSON.stringify(securityPrefix(ctx))) + 64 : 0;
  const bodies = ctx.d.bodies;
  const announced = Number(ctx.req.headers['content-length']);
  const known = Number.isFinite(announced) && announced >= 0;
  // An announced length past 32 MB is read's 413, not an overload.
  if (known && announced <= MAX_BODY_BYTES) {
    if (!bodies.take(announced)) throw overloaded(ctx, announced, RETRY);
    ctx.held = announced;
  }
  ctx.reading = true;
  try {
    ctx.body = await read(
      ctx.req,
      MAX_BODY_BYTES,
      DEFAULT_INLINE_THRESHOLD_BYTES,
      headroom,
      known
        ? undefined
        : (bytes) => {
            if (!bodies.take(bytes)) throw new OverloadedError(String(bytes));
            ctx.held += bytes;
          },
    );
  } catch (err) {
    if (err instanceof RequestTooLargeError) throw new Refusal(ERRORS.tooLarge, 'request body exceeds 32 MB', CLOSE);
    if (err instanceof OverloadedError) throw overloaded(ctx, ctx.held + Number(err.message), RETRY_CLOSE);
    throw err;
  }
  ctx.requestBytes = ctx.body.length;
  ctx.d.metrics.requestBytes.observe({ format: ctx.format! }, ctx.body.length);
}

function overloaded(ctx: CallContext, bytes: number, headers: Record<string, string>): Refusal {
  ctx.d.metrics.overloaded.inc();
  return new Refusal(
    ERRORS.overloaded,
    `overloaded: a body of ${bytes} bytes does not fit in the ${ctx.d.bodies.max} bytes of request bodies held at once (--max-buffered-bodies; ${ctx.d.bodies.held} held)`,
    headers,
  );
}
