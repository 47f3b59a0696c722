import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { answersWithoutModelOutput } from '../formats.ts';

// The call's tool-call decision (tool-decisions.ts): set before the upstream is asked, read by the
// relays as each tool call of the answer is whole. Null when the caller's governance has no tool rule:
// then the relays take their path without tool calls, at no cost. Under a tool rule, a route other
// than the inference routes is refused unless its answers never carry model output (formats.ts):
// a stored response, batch results or a conversation's items would replay tool calls undecided.

export function toolPolicy(ctx: CallContext): void {
  const decide = ctx.d.toolDecider(ctx);
  if (ctx.inference) {
    ctx.decideTool = decide;
    return;
  }
  if (decide !== null && !answersWithoutModelOutput(ctx.req.method ?? '', ctx.path))
    throw new Refusal(
      ERRORS.toolPolicyRoute,
      `${ctx.req.method} ${ctx.path} refused under a tool-call policy: its answers can carry tool calls the policy has not decided`,
    );
}
