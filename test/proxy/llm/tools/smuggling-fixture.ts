import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { isDeepStrictEqual } from 'node:util';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import type { Test } from 'tap';
import type { WireFormat } from '../../../../pipeline/policy/snapshot.ts';
import { streamToolGate } from '../../../../proxy/llm/tools/stream-formats.ts';
import type { ToolCall, ToolVerdict } from '../../../../proxy/llm/tools/types.ts';

// Streams built to slip a tool call past the gate (framing and index tricks a provider never sends,
// but a compromised or odd upstream may), read by the official SDKs: whatever call an SDK ends up
// with must be one the gate decided and allowed, with the very arguments that were decided.
//
// A node:http server plays the provider: it answers `stream.body` through the tool gate, byte by byte
// (every split the framer must get right). The decision: `delete_files` is refused, `pay` is refused
// past an amount of 100 (or when its arguments do not parse: fail closed), everything else allowed.

const PATHS: Record<string, WireFormat> = {
  '/v1/messages': 'anthropic-messages',
  '/v1/chat/completions': 'openai-chat',
  '/v1/responses': 'openai-responses',
};

export interface SmugglingServer {
  /** What the next answer streams. */
  body: string;
  /** The decisions the gate asked for, with their verdicts. */
  decided: { call: ToolCall; verdict: ToolVerdict }[];
  anthropic: Anthropic;
  openai: OpenAI;
  close(): Promise<void>;
}

export function verdictOf(call: ToolCall): ToolVerdict {
  const no = { allow: false, message: `[dvx] The tool call ${call.name} (id ${call.id}) was not run: refused.` };
  if (call.name === 'delete_files' || call.name === 'local_shell') return no;
  if (call.name === 'pay') {
    try {
      const amount = (JSON.parse(call.arguments) as { amount?: unknown }).amount;
      if (typeof amount !== 'number' || amount > 100) return no;
    } catch {
      return no;
    }
  }
  return { allow: true, message: '' };
}

export async function smugglingServer(): Promise<SmugglingServer> {
  const state = { body: '', decided: [] as SmugglingServer['decided'] };
  const server = http.createServer(async (req, res) => {
    for await (const _ of req);
    const gate = streamToolGate(PATHS[req.url ?? ''], async (call) => {
      await sleep(2);
      const verdict = verdictOf(call);
      state.decided.push({ call, verdict });
      return verdict;
    });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const writing = (async () => {
      for (let b = await gate.next(); b !== null; b = await gate.next()) res.write(b);
      res.end();
    })();
    const bytes = Buffer.from(state.body);
    for (let i = 0; i < bytes.length; i++) gate.push(bytes.subarray(i, i + 1));
    gate.end();
    await writing;
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return Object.assign(state, {
    anthropic: new Anthropic({ apiKey: 'k', baseURL: base, maxRetries: 0 }),
    openai: new OpenAI({ apiKey: 'k', baseURL: `${base}/v1`, maxRetries: 0 }),
    close: () => new Promise<void>((r) => server.close(() => r())),
  });
}

/** An SSE event. */
export const ev = (name: string | null, data: unknown) =>
  `${name ? `event: ${name}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;

/** A call as the agent's SDK ended up with it. */
export interface AgentCall {
  id: string;
  name: string;
  args: unknown;
}

/** Every call the agent received must be one decided and allowed, with the arguments decided. */
export function onlyAllowed(t: Test, s: SmugglingServer, got: AgentCall[]): void {
  const offenders = got.filter((c) => {
    const d = s.decided.find((x) => x.call.id === c.id && x.call.name === c.name && x.verdict.allow);
    if (d === undefined) return true;
    try {
      return !isDeepStrictEqual(c.args, JSON.parse(d.call.arguments));
    } catch {
      return true;
    }
  });
  t.same(offenders, [], 'every call the agent received was decided and allowed, with the arguments decided');
}

type Obj = Record<string, unknown>;

// ---- Anthropic ----

export const BOM = '\uFEFF';
export const msgStart = ev('message_start', {
  type: 'message_start',
  message: {
    id: 'msg_1',
    type: 'message',
    role: 'assistant',
    model: 'm',
    content: [],
    stop_reason: null,
    stop_sequence: null,
    usage: { input_tokens: 1, output_tokens: 1 },
  },
});
export const msgEnd =
  ev('message_delta', {
    type: 'message_delta',
    delta: { stop_reason: 'tool_use', stop_sequence: null },
    usage: { output_tokens: 9 },
  }) + ev('message_stop', { type: 'message_stop' });
export const aStart = (index: unknown, block: Obj) =>
  ev('content_block_start', {
    type: 'content_block_start',
    ...(index === undefined ? {} : { index }),
    content_block: block,
  });
export const aJson = (index: unknown, partial_json: string) =>
  ev('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json } });
export const aStop = (index: unknown) =>
  ev('content_block_stop', { type: 'content_block_stop', ...(index === undefined ? {} : { index }) });
export const toolUse = (id: string, name: string, input: Obj = {}) => ({ type: 'tool_use', id, name, input });

export async function anthropicCalls(s: SmugglingServer): Promise<AgentCall[]> {
  const m = await s.anthropic.messages
    .stream({ model: 'm', max_tokens: 9, messages: [{ role: 'user', content: 'hi' }] })
    .finalMessage();
  return m.content.flatMap((b) => (b.type === 'tool_use' ? [{ id: b.id, name: b.name, args: b.input }] : []));
}

// ---- OpenAI chat ----

const head = { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm' };
export const chatChunk = (choice: Obj) =>
  ev(null, { ...head, choices: [{ logprobs: null, finish_reason: null, ...choice }] });
/** A chunk whose choices are given as they are. */
export const chatRaw = (choices: unknown[]) => ev(null, { ...head, choices });
export const toolCall = (index: number, fn: Obj, id?: string) => ({
  tool_calls: [{ index, ...(id ? { id, type: 'function' } : {}), function: fn }],
});

export async function chatCalls(s: SmugglingServer): Promise<AgentCall[]> {
  const c = await s.openai.chat.completions
    .stream({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })
    .finalChatCompletion();
  return c.choices.flatMap((ch) =>
    (ch.message.tool_calls ?? []).map((x) => ({
      id: x.id,
      name: x.type === 'function' ? x.function.name : '',
      args: JSON.parse(x.type === 'function' ? x.function.arguments : '') as unknown,
    })),
  );
}

// ---- OpenAI Responses ----

export function responsesEvents() {
  let seq = 0;
  return (type: string, data: Obj) => ev(type, { type, sequence_number: seq++, ...data });
}
export const response = (status: string, output: unknown[]) => ({
  id: 'resp_1',
  object: 'response',
  created_at: 1,
  status,
  model: 'm',
  output,
  parallel_tool_calls: true,
  tool_choice: 'auto',
  tools: [],
  usage: null,
});
export const functionCall = (n: number, name: string, args: string, status = 'completed') => ({
  id: `fc_${n}`,
  type: 'function_call',
  status,
  call_id: `call_${n}`,
  name,
  arguments: args,
});
export const messageItem = { id: 'msg_1', type: 'message', status: 'in_progress', role: 'assistant', content: [] };

/** The calls of the final response, and of every output_item.done event (what event consumers run). */
export async function responsesCalls(s: SmugglingServer): Promise<AgentCall[]> {
  const stream = s.openai.responses.stream({ model: 'm', input: 'hi' });
  const fromEvents: AgentCall[] = [];
  stream.on('response.output_item.done', (e) => {
    if (e.item.type === 'function_call')
      fromEvents.push({ id: e.item.call_id, name: e.item.name, args: JSON.parse(e.item.arguments) });
  });
  const r = await stream.finalResponse();
  const final = r.output.flatMap((o) =>
    o.type === 'function_call' ? [{ id: o.call_id, name: o.name, args: JSON.parse(o.arguments) as unknown }] : [],
  );
  return [...final, ...fromEvents];
}
