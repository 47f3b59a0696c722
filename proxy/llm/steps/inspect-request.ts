import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { inspect, noteOutcome } from '../inspection.ts';

// The request pipeline runs on every body that leaves for the provider: inference calls, and the
// other routes that carry content (embeddings, count_tokens, batches, file uploads), over the final
// outbound body (translated, prefixed). A pass-through body is inspected as sent; model restriction
// checks every model it names, anywhere in it (pipeline/inspectors/named-models.ts; on a pool worker
// when the body is large). spec: llm-content-policy, "Errors": 403 on a block, 503 when fail-closed.

export function inspectRequest(ctx: CallContext): Promise<void> | void {
  // Nothing to inspect costs no promise.
  if (ctx.body.length === 0 || !ctx.inspect) return;
  return inspectBody(ctx);
}

async function inspectBody(ctx: CallContext): Promise<void> {
  const contentType = ctx.inference ? undefined : (ctx.req.headers['content-type'] ?? null);
  const outcome = await inspect(ctx, ctx.body, 'request', contentType);
  noteOutcome(ctx, outcome, 'request');
  if (outcome.decision === 'block') throw new Refusal(ERRORS.contentPolicy, null);
  if (outcome.decision === 'unavailable') throw new Refusal(ERRORS.inspectionUnavailable, null);
}
