import { topLevelString } from '../../../pipeline/json-view.ts';
import type { CallContext } from '../context.ts';
import { BodyShapeError, badRequest, ERRORS, Refusal } from '../errors.ts';
import { anthropicThread, injectPrefix, securityContext } from '../formats.ts';

// The security-context prefix (spec rule 5) in an inference body's system prompt, and the model the
// call names (a string model is required of an inference call; any other body's is recorded if named).
// An Anthropic thread's continuation carries no `system`: the provider keeps the one the thread was
// created with (prefix included: the create came through here) and refuses a continuation that
// repeats it, so the prefix is not injected again (docs/tool-policy.md, "Server-held conversations").

export function prefix(ctx: CallContext): void {
  if (!ctx.inference) {
    if (ctx.body.length > 0) ctx.model = topLevelString(ctx.body, 'model');
    return;
  }
  try {
    if (!continuesThread(ctx)) ctx.body = injectPrefix(ctx.upstreamFormat!, ctx.body, securityPrefix(ctx));
  } catch (err) {
    if (err instanceof BodyShapeError) throw new Refusal(badRequest(err.message), err.message);
    throw err;
  }
  ctx.model = topLevelString(ctx.body, 'model');
  if (ctx.model === null) throw new Refusal(ERRORS.modelRequired, 'model: a string model is required');
}

/** An Anthropic call continuing a thread the provider holds. */
function continuesThread(ctx: CallContext): boolean {
  return ctx.upstreamFormat === 'anthropic-messages' && anthropicThread(ctx.body)?.type === 'continue';
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
