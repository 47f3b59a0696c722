import type { StreamedResponse } from '../../../pipeline/engine.ts';
import type { CallContext } from '../context.ts';
import { inspect, noteOutcome, policyOf } from '../inspection.ts';

// The response pipeline: observe-only (findings and fail-opens go to the record), over the bytes the
// upstream sent (a stream's and a pass-through answer's first 32 MB). An inspection that cannot run is
// a fail-open of every inspector, never a failed call. A stream is inspected as it arrives
// (pipeline/stream-inspection.ts): at its end only the last stretch is left to scan.

export async function inspectResponse(ctx: CallContext, body: Buffer): Promise<void> {
  if (!ctx.inspect) return;
  try {
    noteOutcome(ctx, await inspect(ctx, body, 'response'), 'response');
  } catch (err) {
    failedOpen(ctx, err);
  }
}

/** A stream's inspection, started before its first byte; null when nothing is inspected. */
export async function startStreamInspection(ctx: CallContext): Promise<StreamedResponse | null> {
  if (!ctx.inspect) return null;
  try {
    const identity = ctx.identity!;
    return ctx.d.engine.streamInspection({
      policy: await policyOf(ctx),
      secrets: ctx.d.secrets.agentSecrets(identity.agentId),
      identity: { agentId: identity.agentId, orgId: identity.orgId, agentName: identity.agentName },
    });
  } catch (err) {
    failedOpen(ctx, err);
    return null;
  }
}

/** The stream ended: what is left is scanned, and the outcome noted as inspectResponse notes it. */
export async function finishStreamInspection(ctx: CallContext, stream: StreamedResponse): Promise<void> {
  try {
    noteOutcome(ctx, await stream.finish(), 'response');
  } catch (err) {
    failedOpen(ctx, err);
  }
}

function failedOpen(ctx: CallContext, err: unknown): void {
  ctx.failOpen = true;
  ctx.failures.push({ phase: 'response', inspector: 'all', reason: 'error' });
  ctx.d.log.warn({ err, request_id: ctx.id, phase: 'response' }, 'inspection failopen');
}
