import type { AnswerJson, PlainToolCodec, ToolCall } from './types.ts';

// OpenAI Chat Completions, plain answers: the calls are every choice's `message.tool_calls[]`
// (`function` calls, and `custom` ones whose `input` is free text), then its legacy
// `message.function_call`, choice after choice (n > 1: seq runs across them). A refused call is taken
// out of `tool_calls` (the rest re-indexed when they carry an `index`; `tool_calls` dropped when none is
// left) and its denial appended to `message.content` (paragraphs joined with a blank line);
// `finish_reason` stays `tool_calls`/`function_call` only while an allowed call remains in that
// choice, else `stop` (docs/tool-policy.md, "Denials").

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v: unknown) => (typeof v === 'string' ? v : '');

/** The legacy function call has no id: this one names it in the denial. */
export const LEGACY_FUNCTION_CALL_ID = 'function_call';

interface Found {
  seq: number;
  choice: number;
  /** Its position in `tool_calls`, or -1 for the legacy `function_call`. */
  at: number;
  call: ToolCall;
}

function found(answer: AnswerJson): Found[] {
  const choices = answer.choices;
  if (!Array.isArray(choices)) return [];
  const out: Found[] = [];
  choices.forEach((choice, c) => {
    const message = isObj(choice) ? choice.message : undefined;
    if (!isObj(message)) return;
    if (Array.isArray(message.tool_calls)) {
      message.tool_calls.forEach((tc, at) => {
        if (!isObj(tc)) return;
        const custom = tc.type === 'custom' && isObj(tc.custom);
        const fn = custom ? (tc.custom as Obj) : isObj(tc.function) ? tc.function : {};
        const args = custom ? fn.input : fn.arguments;
        out.push({
          seq: out.length,
          choice: c,
          at,
          call: { seq: out.length, id: str(tc.id), name: str(fn.name), arguments: str(args) },
        });
      });
    }
    if (isObj(message.function_call)) {
      const fc = message.function_call;
      out.push({
        seq: out.length,
        choice: c,
        at: -1,
        call: { seq: out.length, id: LEGACY_FUNCTION_CALL_ID, name: str(fc.name), arguments: str(fc.arguments) },
      });
    }
  });
  return out;
}

export const openaiChatPlain: PlainToolCodec = {
  format: 'openai-chat',
  calls: (answer) => found(answer).map((f) => f.call),
  rewrite(answer, refused) {
    const all = found(answer);
    if (!all.some((f) => refused.has(f.seq))) return answer;
    const choices = [...(answer.choices as unknown[])];
    const byChoice = new Map<number, Found[]>();
    for (const f of all) byChoice.set(f.choice, [...(byChoice.get(f.choice) ?? []), f]);
    for (const [c, calls] of byChoice) {
      const denials = calls.filter((f) => refused.has(f.seq)).map((f) => refused.get(f.seq)!);
      if (denials.length === 0) continue;
      const choice = choices[c] as Obj;
      const message: Obj = { ...(choice.message as Obj) };
      const refusedAt = new Set(calls.filter((f) => f.at >= 0 && refused.has(f.seq)).map((f) => f.at));
      if (Array.isArray(message.tool_calls)) {
        const kept = (message.tool_calls as unknown[]).filter((_, at) => !refusedAt.has(at));
        if (kept.length === 0) delete message.tool_calls;
        else
          message.tool_calls = kept.map((tc, index) =>
            isObj(tc) && typeof tc.index === 'number' ? { ...tc, index } : tc,
          );
      }
      if (calls.some((f) => f.at === -1 && refused.has(f.seq))) delete message.function_call;
      message.content = appended(message.content, denials.join('\n\n'));
      const next: Obj = { ...choice, message };
      const allowedLeft = calls.some((f) => !refused.has(f.seq));
      if ((choice.finish_reason === 'tool_calls' || choice.finish_reason === 'function_call') && !allowedLeft)
        next.finish_reason = 'stop';
      choices[c] = next;
    }
    return { ...answer, choices };
  },
};

/** The message's content with the denials after it: a string, or one more text part when it is a list of parts. */
function appended(content: unknown, text: string): unknown {
  if (Array.isArray(content)) return [...content, { type: 'text', text }];
  return typeof content === 'string' && content !== '' ? `${content}\n\n${text}` : text;
}
