import { allocShared, DEFAULT_INLINE_THRESHOLD_BYTES, MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import { redact } from '../../../pipeline/finding.ts';
import { topLevel, topLevelString } from '../../../pipeline/json-view.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { anthropicThread } from '../formats.ts';
import type { RememberedRefusal } from '../tools/refusal-memory.ts';
import type { ToolCall } from '../tools/types.ts';

// Refused tool calls in conversations the provider holds (docs/tool-policy.md, "Server-held
// conversations"). A refused call reaches the agent rewritten (a text block, a message item), but a
// provider that holds the conversation (an Anthropic thread, a Responses chain) remembers the
// ORIGINAL answer, refused call included, and refuses a next turn that does not answer it. So:
//
//   answer rewritten (relay-plain, stream gate) ─▶ rememberRefusals: (agent, answer id) → refused calls
//   next request continues that answer ─▶ this step: an ERROR TOOL RESULT, the denial the agent read,
//                                         for each refused call the request does not answer itself
//
// Spec rule 6: a denied action is returned to the agent as an error tool result; here the provider's
// copy of the conversation gets it. Anthropic: `tool_result` blocks (is_error) first in the new user
// message (inserted when the request's first message is not one); Responses: `function_call_output`
// items first in `input`. The body is re-serialized only when something is added. A call of an agent
// whose answers were never rewritten costs one Map lookup. Chat Completions holds no state; a
// translated call (--translate) forwards no state either: neither is touched.

/**
 * Records refused calls of a rewritten answer (its `id` as the agent sees it) when the request asked
 * the provider to hold the conversation. Called by the plain relay once per answer, and by the stream
 * gate as each call is refused (calls add up per answer). Must run before the answer's last byte
 * leaves, so the agent's next turn finds them. `custom`: a Responses `custom_tool_call`.
 */
export function rememberRefusals(
  ctx: CallContext,
  answerId: string | null,
  refused: readonly { call: Pick<ToolCall, 'id' | 'name'>; message: string; custom?: boolean }[],
): void {
  const memory = ctx.d.refusals;
  if (!memory || answerId === null || answerId === '' || refused.length === 0 || !ctx.identity) return;
  if (ctx.translatedTo !== null || !holdsConversation(ctx)) return;
  const refusals: RememberedRefusal[] = refused
    .filter((r) => r.call.id !== '')
    .map((r) => ({ callId: r.call.id, tool: r.call.name, message: r.message, ...(r.custom ? { custom: true } : {}) }));
  memory.remember(ctx.identity.agentId, answerId, refusals);
}

/**
 * Whether the provider keeps this call's answer: an Anthropic request with a `thread` (create or
 * continue), a Responses request unless `store: false` (stored by default).
 */
function holdsConversation(ctx: CallContext): boolean {
  if (ctx.format === 'anthropic-messages') return anthropicThread(ctx.body) !== null;
  if (ctx.format === 'openai-responses') {
    const store = topLevel(ctx.body, 'store');
    return !(store?.value && ctx.body.toString('latin1', store.value.start, store.value.end) === 'false');
  }
  return false;
}

type Obj = Record<string, unknown>;
const OUTPUT_TYPES = new Set<unknown>(['function_call_output', 'custom_tool_call_output']);
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The answer a request continues: Anthropic `thread.previous_message_id`, Responses `previous_response_id`. */
function continuedAnswer(ctx: CallContext): string | null {
  if (ctx.format === 'anthropic-messages') {
    const thread = anthropicThread(ctx.body);
    return thread?.type === 'continue' && typeof thread.previous_message_id === 'string'
      ? thread.previous_message_id
      : null;
  }
  if (ctx.format === 'openai-responses') return topLevelString(ctx.body, 'previous_response_id');
  return null;
}

export function refusedResults(ctx: CallContext): void {
  const memory = ctx.d.refusals;
  if (!memory || !ctx.inference || ctx.translatedTo !== null || !ctx.identity) return;
  const agentId = ctx.identity.agentId;
  if (!memory.holdsAgent(agentId)) return;
  const answerId = continuedAnswer(ctx);
  if (answerId === null) return;
  const refusals = memory.recall(agentId, answerId);
  if (refusals === null) return;
  let body: unknown;
  try {
    body = JSON.parse(ctx.body.toString('utf8'));
  } catch {
    return; // not JSON: the prefix step answers 400, the provider never sees it
  }
  if (!isObj(body)) return;
  const added = ctx.format === 'anthropic-messages' ? answerAnthropic(body, refusals) : answerResponses(body, refusals);
  if (added.length === 0) return;
  const text = JSON.stringify(body);
  const size = Buffer.byteLength(text);
  if (size > MAX_BODY_BYTES) {
    throw new Refusal(ERRORS.tooLarge, 'request body exceeds 32 MB with the error results of refused tool calls');
  }
  const out = size >= DEFAULT_INLINE_THRESHOLD_BYTES ? allocShared(size) : Buffer.allocUnsafe(size);
  out.write(text, 0, 'utf8');
  ctx.body = out;
  for (const r of added) {
    ctx.findings.push({
      inspector_type: 'tool_policy',
      severity: 'log',
      description: `error tool result added for the refused call ${r.tool} of answer ${answerId} (server-held conversation)`,
      match: redact(r.callId),
      location: 'request_body',
    });
  }
  ctx.d.log.info(
    { request_id: ctx.id, agent_id: agentId, answer_id: answerId, calls: added.map((r) => r.callId) },
    'error tool results added for refused calls of a server-held conversation',
  );
}

/**
 * Anthropic: the tool results must come first in the user message right after the answer (the
 * request's first message on a thread continuation): a `tool_result` with `is_error` per refused call
 * it does not answer, before its content; a user message of their own when the first is not a user's.
 */
function answerAnthropic(body: Obj, refusals: readonly RememberedRefusal[]): RememberedRefusal[] {
  if (body.messages !== undefined && !Array.isArray(body.messages)) return [];
  const messages = (body.messages as unknown[] | undefined) ?? [];
  const first = messages[0];
  const userFirst = isObj(first) && first.role === 'user';
  const answered = new Set<unknown>();
  if (userFirst && Array.isArray(first.content)) {
    for (const block of first.content)
      if (isObj(block) && block.type === 'tool_result') answered.add(block.tool_use_id);
  }
  const missing = refusals.filter((r) => !answered.has(r.callId));
  if (missing.length === 0) return [];
  const results = missing.map((r) => ({
    type: 'tool_result',
    tool_use_id: r.callId,
    is_error: true,
    content: r.message,
  }));
  if (!userFirst) {
    body.messages = [{ role: 'user', content: results }, ...messages];
  } else {
    const content = first.content;
    const rest = Array.isArray(content)
      ? content
      : typeof content === 'string' && content !== ''
        ? [{ type: 'text', text: content }]
        : [];
    body.messages = [{ ...first, content: [...results, ...rest] }, ...messages.slice(1)];
  }
  return missing;
}

/**
 * Responses: a `function_call_output` (`custom_tool_call_output` for a custom tool's call) per refused
 * call the input does not answer, first in `input`.
 */
function answerResponses(body: Obj, refusals: readonly RememberedRefusal[]): RememberedRefusal[] {
  const input = body.input;
  if (input !== undefined && input !== null && typeof input !== 'string' && !Array.isArray(input)) return [];
  const answered = new Set<unknown>();
  if (Array.isArray(input)) {
    for (const item of input) if (isObj(item) && OUTPUT_TYPES.has(item.type)) answered.add(item.call_id);
  }
  const missing = refusals.filter((r) => !answered.has(r.callId));
  if (missing.length === 0) return [];
  const outputs = missing.map((r) => ({
    type: r.custom ? 'custom_tool_call_output' : 'function_call_output',
    call_id: r.callId,
    output: r.message,
  }));
  const rest = Array.isArray(input)
    ? input
    : typeof input === 'string'
      ? [{ type: 'message', role: 'user', content: input }]
      : [];
  body.input = [...outputs, ...rest];
  return missing;
}
