import type { CallContext } from '../context.ts';
import { inspect, noteOutcome } from '../inspection.ts';

// The response pipeline: observe-only (findings and fail-opens go to the record), over the bytes the
// upstream sent (a stream's and a pass-through answer's first 32 MB). An inspection that cannot run is
// a fail-open of every inspector, never a failed call.

export async function inspectResponse(ctx: CallContext, body: Buffer): Promise<void> {
  if (!ctx.inspect) return;
  try {
    noteOutcome(ctx, await inspect(ctx, body, 'response'), 'response');
  } catch (err) {
    ctx.failOpen = true;
    ctx.failures.push({ phase: 'response', inspector: 'all', reason: 'error' });
    ctx.d.log.warn({ err, request_id: ctx.id, phase: 'response' }, 'inspection failopen');
  }
}
