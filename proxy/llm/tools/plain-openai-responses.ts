import type { AnswerJson, PlainToolCodec, ToolCall } from './types.ts';

// OpenAI Responses, plain answers: the calls are the `function_call` items of `output` (and
// `custom_tool_call` ones, whose `input` is free text, and the built-in tools the agent itself runs:
// `local_shell_call`, `shell_call`, `computer_call`, `apply_patch_call`, decided under the names
// `local_shell`, `shell`, `computer`, `apply_patch` on their `action` / `operation` as JSON text);
// the id the agent answers with is `call_id`. A
// refused one becomes an assistant `message` item, at the same position, with one `output_text` part
// holding the denial (docs/tool-policy.md, "Denials"). Responses has no stop reason to change.
// Items the provider runs itself (web_search_call, file_search_call, mcp_call, …) are not calls here.

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v: unknown) => (typeof v === 'string' ? v : '');

/** The items the agent runs (plain and streamed), and the field holding each one's arguments. */
export const CALL_ITEMS: Readonly<Record<string, string>> = {
  function_call: 'arguments',
  custom_tool_call: 'input',
  local_shell_call: 'action',
  shell_call: 'action',
  computer_call: 'action',
  apply_patch_call: 'operation',
};

export const isCallItem = (item: unknown): item is Obj => isObj(item) && Object.hasOwn(CALL_ITEMS, item.type as string);

/** The tool a call item names: its `name`, or for a built-in tool its type without `_call`. */
export function callName(item: Obj): string {
  return item.type === 'function_call' || item.type === 'custom_tool_call'
    ? str(item.name)
    : String(item.type).slice(0, -'_call'.length);
}

/** A call item's arguments as text: the field as it is when text, else its JSON ('' when missing). */
export function callArguments(item: Obj): string {
  const v = item[CALL_ITEMS[item.type as string]];
  if (typeof v === 'string') return v;
  if (v === undefined || v === null) return '';
  try {
    return JSON.stringify(v) ?? '';
  } catch {
    return ''; // nested past the stack: the evaluator fails closed on text that does not parse
  }
}

function calls(answer: AnswerJson): { at: number; item: Obj; call: ToolCall }[] {
  const output = answer.output;
  if (!Array.isArray(output)) return [];
  const out: { at: number; item: Obj; call: ToolCall }[] = [];
  output.forEach((item, at) => {
    if (!isCallItem(item)) return;
    out.push({
      at,
      item,
      call: { seq: out.length, id: str(item.call_id), name: callName(item), arguments: callArguments(item) },
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
