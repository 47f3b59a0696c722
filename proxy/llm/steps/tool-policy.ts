import type { CallContext } from '../context.ts';

// The call's tool-call decision (tool-decisions.ts): set before the upstream is asked, read by the
// relays as each tool call of the answer is whole. Null when the caller's governance has no tool rule
// or the call is no inference call: then the relays take their path without tool calls, at no cost.

export function toolPolicy(ctx: CallContext): void {
  ctx.decideTool = ctx.inference ? ctx.d.toolDecider(ctx) : null;
}
