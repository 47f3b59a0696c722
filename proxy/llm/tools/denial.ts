import type { ToolCall } from './types.ts';

// The text an agent reads in place of a refused tool call, plain or streamed (docs/tool-policy.md,
// "Denials"). `detailed` names the reason; `opaque` says only that policy refused it (spec:
// llm-content-policy, `--inspection-disclosure`). Operators and the decision's record always have the
// reason.

export type Disclosure = 'detailed' | 'opaque';

export const OPAQUE_REASON = 'refused by policy';

export function denialMessage(call: Pick<ToolCall, 'name' | 'id'>, reason: string, disclosure: Disclosure): string {
  const why = disclosure === 'opaque' ? OPAQUE_REASON : reason.trim().replace(/\.+$/, '') || OPAQUE_REASON;
  return `[dvx] The tool call ${call.name} (id ${call.id}) was not run: ${why}.`;
}
