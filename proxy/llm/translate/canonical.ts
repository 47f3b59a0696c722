// The canonical form translation goes through: Anthropic's Messages shapes, the richest of the three
// (typed content blocks, tool_use / tool_result). Every format converts to and from it, so three
// formats need six converters, not twelve.
//
//   agent format ──toCanonical──▶ canonical ──fromCanonical──▶ upstream format       (requests)
//   upstream format ──toCanonical──▶ canonical ──fromCanonical──▶ agent format       (responses)
//   upstream events ──parser──▶ canonical events ──emitter──▶ agent events          (streams)

import { TranslationError } from '../errors.ts';

export type CBlock =
  | { type: 'text'; text: string }
  | { type: 'image'; source: { type: 'base64'; media_type: string; data: string } | { type: 'url'; url: string } }
  | { type: 'tool_use'; id: string; name: string; input: unknown }
  | { type: 'tool_result'; tool_use_id: string; content: string | CBlock[]; is_error?: boolean }
  | { type: 'thinking'; thinking: string; signature?: string };

export interface CMessage {
  role: 'user' | 'assistant';
  content: CBlock[];
}

export interface CTool {
  name: string;
  description?: string;
  input_schema: unknown;
}

export type CToolChoice = { type: 'auto' } | { type: 'any' } | { type: 'none' } | { type: 'tool'; name: string };

export interface CRequest {
  model: string;
  system?: string;
  messages: CMessage[];
  max_tokens: number;
  temperature?: number;
  top_p?: number;
  stop_sequences?: string[];
  stream?: boolean;
  tools?: CTool[];
  tool_choice?: CToolChoice;
}

export type CStopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use' | 'refusal' | 'pause_turn';

export interface CResponse {
  id: string;
  model: string;
  content: CBlock[];
  stop_reason: CStopReason | null;
  usage: { input_tokens: number; output_tokens: number };
}

/** Canonical stream events: Anthropic's, as objects. */
export type CEvent =
  | {
      type: 'message_start';
      message: { id: string; model: string; usage: { input_tokens: number; output_tokens: number } };
    }
  | {
      type: 'content_block_start';
      index: number;
      content_block:
        | { type: 'text'; text: string }
        | { type: 'tool_use'; id: string; name: string; input: Record<string, never> }
        | { type: 'thinking'; thinking: string };
    }
  | {
      type: 'content_block_delta';
      index: number;
      delta:
        | { type: 'text_delta'; text: string }
        | { type: 'input_json_delta'; partial_json: string }
        | { type: 'thinking_delta'; thinking: string };
    }
  | { type: 'content_block_stop'; index: number }
  | {
      type: 'message_delta';
      delta: { stop_reason: CStopReason | null };
      usage: { output_tokens: number; input_tokens?: number };
    }
  | { type: 'message_stop' };

export const DEFAULT_MAX_TOKENS = 4096;

/** Text of a tool result or message content, for formats that only carry strings there. */
export function textOf(content: string | CBlock[]): string {
  if (typeof content === 'string') return content;
  return content.map((b) => (b.type === 'text' ? b.text : '')).join('');
}

/** Anthropic requires alternating roles: consecutive messages of one role are merged. */
export function mergeRoles(messages: CMessage[]): CMessage[] {
  const out: CMessage[] = [];
  for (const m of messages) {
    const last = out.at(-1);
    if (last && last.role === m.role) last.content.push(...m.content);
    else out.push({ role: m.role, content: [...m.content] });
  }
  return out;
}

export function parseArguments(text: unknown): unknown {
  if (typeof text !== 'string' || text === '') return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new TranslationError('tool call arguments are not valid JSON');
  }
}

let counter = 0;
export function syntheticId(prefix: string): string {
  counter = (counter + 1) % 1e9;
  return `${prefix}${Date.now().toString(36)}${counter.toString(36)}`;
}
