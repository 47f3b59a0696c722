import type { WireFormat } from '../../../../pipeline/policy/snapshot.ts';
import { SseParser } from '../../../../core/sse.ts';
import { streamToolGate } from '../../../../proxy/llm/tools/stream-formats.ts';
import type { StreamGate, StreamGateOptions } from '../../../../proxy/llm/tools/stream-gate.ts';
import type { Decide, ToolCall, ToolVerdict } from '../../../../proxy/llm/tools/types.ts';

// Hand-built provider streams with text and two parallel tool calls (get_weather, then delete_files),
// and helpers that run them through the tool gate (proxy/llm/tools/stream-gate.ts).

type Obj = Record<string, unknown>;
const ev = (name: string | null, data: unknown, eol = '\n') =>
  `${name ? `event: ${name}${eol}` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}${eol}${eol}`;

export const WEATHER_ARGS = '{"city":"Paris"}';
export const DELETE_ARGS = '{"path":"/"}';

export function anthropicStream(eol = '\n'): string {
  const e = (name: string, data: Obj) => ev(name, { type: name, ...data }, eol);
  return [
    e('message_start', {
      message: {
        id: 'msg_1',
        type: 'message',
        role: 'assistant',
        model: 'claude-test',
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: 20, output_tokens: 1 },
      },
    }),
    e('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    e('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Checking.' } }),
    e('content_block_stop', { index: 0 }),
    e('content_block_start', {
      index: 1,
      content_block: { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: {} },
    }),
    e('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: WEATHER_ARGS.slice(0, 8) } }),
    e('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: WEATHER_ARGS.slice(8) } }),
    e('content_block_stop', { index: 1 }),
    e('content_block_start', {
      index: 2,
      content_block: { type: 'tool_use', id: 'toolu_2', name: 'delete_files', input: {} },
    }),
    e('content_block_delta', { index: 2, delta: { type: 'input_json_delta', partial_json: DELETE_ARGS } }),
    e('content_block_stop', { index: 2 }),
    e('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 30 } }),
    e('message_stop', {}),
  ].join('');
}

export function chatStream(eol = '\n'): string {
  const head = { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1700000000, model: 'gpt-test' };
  const c = (delta: Obj, finish: string | null = null) =>
    ev(null, { ...head, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] }, eol);
  const call = (index: number, fn: Obj, id?: string) => ({
    tool_calls: [{ index, ...(id ? { id, type: 'function' } : {}), function: fn }],
  });
  return [
    c({ role: 'assistant', content: '' }),
    c({ content: 'Checking.' }),
    c(call(0, { name: 'get_weather', arguments: '' }, 'call_1')),
    c(call(0, { arguments: WEATHER_ARGS.slice(0, 8) })),
    c(call(0, { arguments: WEATHER_ARGS.slice(8) })),
    c(call(1, { name: 'delete_files', arguments: '' }, 'call_2')),
    c(call(1, { arguments: DELETE_ARGS })),
    c({}, 'tool_calls'),
    ev(null, { ...head, choices: [], usage: { prompt_tokens: 20, completion_tokens: 30, total_tokens: 50 } }, eol),
    ev(null, '[DONE]', eol),
  ].join('');
}

export function responsesStream(eol = '\n'): string {
  let seq = 0;
  const e = (type: string, data: Obj) => ev(type, { type, sequence_number: seq++, ...data }, eol);
  const response = (status: string, output: unknown[]) => ({
    id: 'resp_1',
    object: 'response',
    created_at: 1700000000,
    status,
    model: 'gpt-test',
    output,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    usage: status === 'completed' ? { input_tokens: 20, output_tokens: 30, total_tokens: 50 } : null,
  });
  const text = { type: 'output_text', text: 'Checking.', annotations: [] };
  const msg = { id: 'msg_1', type: 'message', status: 'completed', role: 'assistant', content: [text] };
  const fc = (n: number, name: string, args: string, status = 'completed') => ({
    id: `fc_${n}`,
    type: 'function_call',
    status,
    call_id: `call_${n}`,
    name,
    arguments: args,
  });
  const call = (n: number, name: string, args: string) => [
    e('response.output_item.added', { output_index: n, item: fc(n, name, '', 'in_progress') }),
    e('response.function_call_arguments.delta', { item_id: `fc_${n}`, output_index: n, delta: args.slice(0, 5) }),
    e('response.function_call_arguments.delta', { item_id: `fc_${n}`, output_index: n, delta: args.slice(5) }),
    e('response.function_call_arguments.done', { item_id: `fc_${n}`, output_index: n, arguments: args }),
    e('response.output_item.done', { output_index: n, item: fc(n, name, args) }),
  ];
  return [
    e('response.created', { response: response('in_progress', []) }),
    e('response.in_progress', { response: response('in_progress', []) }),
    e('response.output_item.added', { output_index: 0, item: { ...msg, status: 'in_progress', content: [] } }),
    e('response.content_part.added', {
      item_id: 'msg_1',
      output_index: 0,
      content_index: 0,
      part: { ...text, text: '' },
    }),
    e('response.output_text.delta', { item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'Checking.' }),
    e('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text: 'Checking.' }),
    e('response.content_part.done', { item_id: 'msg_1', output_index: 0, content_index: 0, part: text }),
    e('response.output_item.done', { output_index: 0, item: msg }),
    ...call(1, 'get_weather', WEATHER_ARGS),
    ...call(2, 'delete_files', DELETE_ARGS),
    e('response.completed', {
      response: response('completed', [msg, fc(1, 'get_weather', WEATHER_ARGS), fc(2, 'delete_files', DELETE_ARGS)]),
    }),
  ].join('');
}

export const STREAMS: Record<WireFormat, (eol?: string) => string> = {
  'anthropic-messages': anthropicStream,
  'openai-chat': chatStream,
  'openai-responses': responsesStream,
};

export const FORMATS = Object.keys(STREAMS) as WireFormat[];

/** Allows every call but `delete_files`, at once. */
export const denyDeletes: Decide = async (call) => verdictFor(call);

export function verdictFor(call: ToolCall): ToolVerdict {
  return call.name === 'delete_files'
    ? { allow: false, message: `[dvx] The tool call ${call.name} (id ${call.id}) was not run: denied by rule.` }
    : { allow: true, message: '' };
}

/** Runs `chunks` through a gate and returns all it let out. */
export async function through(
  format: WireFormat,
  chunks: Buffer[],
  decide: Decide,
  options: StreamGateOptions = {},
): Promise<{ out: Buffer; gate: StreamGate }> {
  const gate = streamToolGate(format, decide, options);
  const out: Buffer[] = [];
  const reading = (async () => {
    for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
  })();
  for (const c of chunks) gate.push(c);
  gate.end();
  await reading;
  return { out: Buffer.concat(out), gate };
}

/** The data of each event of an SSE byte stream, parsed when JSON. */
export function eventsOf(bytes: Buffer | string): { event: string | null; data: unknown }[] {
  const p = new SseParser();
  const all = [...p.push(Buffer.from(bytes)), ...p.end()];
  return all.map((e) => {
    try {
      return { event: e.event, data: JSON.parse(e.data) };
    } catch {
      return { event: e.event, data: e.data };
    }
  });
}

/** A controllable decision: resolve each call's verdict when the test says. */
export function manualDecide(): { decide: Decide; seen: ToolCall[]; settle(seq: number, v: ToolVerdict): void } {
  const seen: ToolCall[] = [];
  const pending = new Map<number, (v: ToolVerdict) => void>();
  return {
    seen,
    decide: (call) => {
      seen.push(call);
      return new Promise((r) => pending.set(call.seq, r));
    },
    settle: (seq, v) => pending.get(seq)!(v),
  };
}
