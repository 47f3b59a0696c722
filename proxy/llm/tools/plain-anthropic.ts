import type { AnswerJson, PlainToolCodec, ToolCall } from './types.ts';

// Anthropic Messages, plain answers: the calls are the `tool_use` blocks of `content`. A refused one
// becomes a `text` block, at the same position, holding the denial; `stop_reason` stays `tool_use`
// only while an allowed call remains, else `end_turn` (docs/tool-policy.md, "Denials").
// (`server_tool_use` and `mcp_tool_use` blocks are run by the provider, not the agent: not calls here.)

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v: unknown) => (typeof v === 'string' ? v : '');

/** Each tool_use block with its position in `content` and its seq, in order. */
function toolUses(answer: AnswerJson): { at: number; block: Obj; seq: number }[] {
  const content = answer.content;
  if (!Array.isArray(content)) return [];
  const out: { at: number; block: Obj; seq: number }[] = [];
  content.forEach((block, at) => {
    if (isObj(block) && block.type === 'tool_use') out.push({ at, block, seq: out.length });
  });
  return out;
}

/** `input` as the JSON text the agent's SDK will see; '' (does not parse: fail closed) when it cannot be written. */
function argumentsOf(input: unknown): string {
  try {
    return JSON.stringify(input) ?? '';
  } catch {
    return ''; // nested past the stack: the evaluator fails closed on text that does not parse
  }
}

export const anthropicPlain: PlainToolCodec = {
  format: 'anthropic-messages',
  calls(answer) {
    return toolUses(answer).map(
      ({ block, seq }): ToolCall => ({
        seq,
        id: str(block.id),
        name: str(block.name),
        arguments: argumentsOf(block.input),
      }),
    );
  },
  rewrite(answer, refused) {
    const uses = toolUses(answer);
    if (!uses.some((u) => refused.has(u.seq))) return answer;
    const content = [...(answer.content as unknown[])];
    for (const { at, seq } of uses) {
      const message = refused.get(seq);
      if (message !== undefined) content[at] = { type: 'text', text: message };
    }
    const out: AnswerJson = { ...answer, content };
    const allowedLeft = uses.some((u) => !refused.has(u.seq));
    if (answer.stop_reason === 'tool_use' && !allowedLeft) out.stop_reason = 'end_turn';
    return out;
  },
};
