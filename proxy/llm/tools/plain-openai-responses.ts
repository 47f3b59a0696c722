import type { AnswerJson, PlainToolCodec, ToolCall } from './types.ts';

// OpenAI Responses, plain answers: the calls are the `function_call` items of `output` (and
// `custom_tool_call` ones, whose `input` is free text); the id the agent answers with is `call_id`. A
// refused one becomes an assistant `message` item, at the same position, with one `output_text` part
// holding the denial (docs/tool-policy.md, "Denials"). Responses has no stop reason to change.
// Items the provider runs itself (web_search_call, file_search_call, mcp_call, …) are not calls here.

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v: unknown) => (typeof v === 'string' ? v : '');

const CALL_TYPES = new Set(['function_call', 'custom_tool_call']);

function calls(answer: AnswerJson): { at: number; item: Obj; call: ToolCall }[] {
  const output = answer.output;
  if (!Array.isArray(output)) return [];
  const out: { at: number; item: Obj; call: ToolCall }[] = [];
  output.forEach((item, at) => {
    if (!isObj(item) || !CALL_TYPES.has(item.type as string)) return;
    const args = item.type === 'custom_tool_call' ? item.input : item.arguments;
    out.push({
      at,
      item,
      call: { seq: out.length, id: str(item.call_id), name: str(item.name), arguments: str(args) },
    });
  });
  return out;
}

/** The `message` output item that takes a refused call's place. */
export function denialItem(item: Obj, text: string): Obj {
  return {
    type: 'message',
    id: `msg_dvx_${str(item.id) || str(item.call_id)}`,
    status: 'completed',
    role: 'assistant',
    content: [{ type: 'output_text', text, annotations: [] }],
  };
}

export const openaiResponsesPlain: PlainToolCodec = {
  format: 'openai-responses',
  calls: (answer) => calls(answer).map((c) => c.call),
  rewrite(answer, refused) {
    const found = calls(answer);
    if (!found.some((c) => refused.has(c.call.seq))) return answer;
    const output = [...(answer.output as unknown[])];
    for (const { at, item, call } of found) {
      const message = refused.get(call.seq);
      if (message !== undefined) output[at] = denialItem(item, message);
    }
    return { ...answer, output };
  },
};
