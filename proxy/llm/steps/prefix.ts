import { topLevelString } from '../../../pipeline/json-view.ts';
import type { CallContext } from '../context.ts';
import { BodyShapeError, badRequest, ERRORS, Refusal } from '../errors.ts';
import { injectPrefix, securityContext } from '../formats.ts';

// The security-context prefix (spec rule 5) in an inference body's system prompt, and the model the
// call names (a string model is required of an inference call; any other body's is recorded if named).

export function prefix(ctx: CallContext): void {
  if (!ctx.inference) {
    if (ctx.body.length > 0) ctx.model = topLevelString(ctx.body, 'model');
    return;
  }
  try {
    ctx.body = injectPrefix(ctx.upstreamFormat!, ctx.body, securityPrefix(ctx));
  } catch (err) {
    if (err instanceof BodyShapeError) throw new Refusal(badRequest(err.message), err.message);
    throw err;
  }
  ctx.model = topLevelString(ctx.body, 'model');
  if (ctx.model === null) throw new Refusal(ERRORS.modelRequired, 'model: a string model is required');
}

/** The call's prefix, made once. */
export function securityPrefix(ctx: CallContext): string {
  const identity = ctx.identity!;
  return (ctx.prefix ??= securityContext({
    agentId: identity.agentId,
    agentName: identity.agentName,
    orgId: identity.orgId,
    enclaveName: ctx.d.options.enclaveName || ctx.snapshot.enclave.name,
  }));
}
