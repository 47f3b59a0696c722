import type { BudgetShortfall } from '../../../core/body-budget.ts';
import { DEFAULT_INLINE_THRESHOLD_BYTES, MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, OverloadedError, Refusal, RequestTooLargeError } from '../errors.ts';
import { readBody as read } from '../read-body.ts';
import { securityPrefix } from './prefix.ts';

// The request body, up to 32 MB (spec: llm-content-policy, "Errors": 413 past it). An inference body
// that keeps its format is read with room for the security-context prefix, JSON-escaped, plus the
// wrapper around it, so the prefix step splices it in place. The body's bytes are taken from the bodies
// held at once (--max-buffered-bodies, core/body-budget.ts) as they arrive, under the caller's agent
// (authenticated before this step), and given back when the call ends (`releaseBody`, proxy.ts). A
// body that cannot fit is answered 503 overloaded_error with retry-after: before it is read when its
// announced length does not fit in what is free now, for every agent or for this one
// (--max-buffered-bodies-per-agent; the body is then drained, the connection kept), else as soon as
// the bytes arrived pass what is free (the connection closed).

const CLOSE = { connection: 'close' };
const RETRY = { 'retry-after': '1' };
const RETRY_CLOSE = { 'retry-after': '1', connection: 'close' };

/** Whose share of the budget the call's body is taken from. */
function holder(ctx: CallContext): string {
  return ctx.identity?.agentId ?? '';
}

export async function readBody(ctx: CallContext): Promise<void> {
  const inPlace = ctx.inference && ctx.upstreamFormat === ctx.format;
  const headroom = inPlace ? Buffer.byteLength(JSON.stringify(securityPrefix(ctx))) + 64 : 0;
  const bodies = ctx.d.bodies;
  const agent = holder(ctx);
  const announced = Number(ctx.req.headers['content-length']);
  // An announced length past 32 MB is read's 413, not an overload. One that fits is checked, not taken.
  if (Number.isFinite(announced) && announced >= 0 && announced <= MAX_BODY_BYTES) {
    const short = bodies.shortfall(agent, announced);
    if (short !== null) throw overloaded(ctx, short, announced, RETRY);
  }
  ctx.reading = true;
  // Why the bytes arrived last did not fit, and the body's size with them.
  const refused = { short: null as BudgetShortfall | null, bytes: 0 };
  try {
    ctx.body = await read(ctx.req, MAX_BODY_BYTES, DEFAULT_INLINE_THRESHOLD_BYTES, headroom, (bytes) => {
      const short = bodies.take(agent, bytes);
      if (short !== null) {
        refused.short = short;
        refused.bytes = ctx.held + bytes;
        throw new OverloadedError(`${refused.bytes} bytes`);
      }
      ctx.held += bytes;
    });
  } catch (err) {
    if (err instanceof RequestTooLargeError) throw new Refusal(ERRORS.tooLarge, 'request body exceeds 32 MB', CLOSE);
    if (err instanceof OverloadedError && refused.short !== null)
      throw overloaded(ctx, refused.short, refused.bytes, RETRY_CLOSE);
    throw err;
  }
  ctx.requestBytes = ctx.body.length;
  ctx.d.metrics.requestBytes.observe({ format: ctx.format! }, ctx.body.length);
}

/** Gives back what the call's body took from the budget; once the call has ended, on every path. */
export function releaseBody(ctx: CallContext): void {
  ctx.d.bodies.give(holder(ctx), ctx.held);
  ctx.held = 0;
}

function overloaded(ctx: CallContext, short: BudgetShortfall, bytes: number, headers: Record<string, string>): Refusal {
  ctx.d.metrics.overloaded.inc();
  const bodies = ctx.d.bodies;
  const room =
    short === 'budget'
      ? `the ${bodies.max} bytes of request bodies held at once (--max-buffered-bodies; ${bodies.held} held)`
      : `the agent's share of ${bodies.perAgent} bytes of request bodies held at once (--max-buffered-bodies-per-agent; ${bodies.heldBy(holder(ctx))} held by it)`;
  return new Refusal(ERRORS.overloaded, `overloaded: a body of ${bytes} bytes does not fit in ${room}`, headers);
}
