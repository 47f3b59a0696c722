import { stringAt, topLevelOf, topLevelString } from '../../../pipeline/json-view.ts';
import type { CallContext } from '../context.ts';
import { BodyShapeError, badRequest, ERRORS, Refusal } from '../errors.ts';
import { anthropicThread, injectPrefix, promptKey, securityContext } from '../formats.ts';

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
  // One walk of the top level for the prompt's member, the model and the thread (a walk of a 64 KB
  // body each, three before). The model is read before the splice: the prefix goes inside the system
  // prompt's value or in a member of its own ahead of the others, so it never changes which `model`
  // the body names.
  const format = ctx.upstreamFormat!;
  const anthropic = format === 'anthropic-messages';
  const top = topLevelOf(ctx.body, anthropic ? [promptKey(format), 'model', 'thread'] : [promptKey(format), 'model']);
  const model = top?.values[1] ? stringAt(ctx.body, top.values[1]) : null;
  // An Anthropic call continuing a thread the provider holds.
  const continues = anthropic && top !== null && anthropicThread(ctx.body, top.values[2])?.type === 'continue';
  try {
    if (!continues) {
      const found = top && { open: top.open, close: top.close, empty: top.empty, value: top.values[0] };
      ctx.body = injectPrefix(format, ctx.body, securityPrefix(ctx), found);
    }
  } catch (err) {
    if (err instanceof BodyShapeError) throw new Refusal(badRequest(err.message), err.message);
    throw err;
  }
  ctx.model = model;
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
