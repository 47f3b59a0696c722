import { formatSse } from '../../../core/sse.ts';
import type { CEvent, CRequest, CResponse } from './canonical.ts';
import { DEFAULT_MAX_TOKENS } from './canonical.ts';

// anthropic-messages is the canonical form: requests and responses convert with little more than a
// copy; stream events are canonical events written as SSE.

export function requestToCanonical(body: Record<string, unknown>): CRequest {
  const system = Array.isArray(body.system)
    ? (body.system as { type: string; text?: string }[]).map((b) => b.text ?? '').join('\n')
    : (body.system as string | undefined);
  const req: CRequest = { ...(body as unknown as CRequest), max_tokens: Number(body.max_tokens ?? DEFAULT_MAX_TOKENS) };
  if (system !== undefined) req.system = system;
  req.messages = (body.messages as CRequest['messages']).map((m) => ({
    role: m.role,
    content: typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content,
  }));
  return req;
}

export function requestFromCanonical(req: CRequest): Record<string, unknown> {
  const out: Record<string, unknown> = { model: req.model, max_tokens: req.max_tokens, messages: req.messages };
  if (req.system) out.system = req.system;
  for (const k of ['temperature', 'top_p', 'stop_sequences', 'stream', 'tools', 'tool_choice'] as const)
    if (req[k] !== undefined) out[k] = req[k];
  return out;
}

export function responseToCanonical(body: Record<string, unknown>): CResponse {
  const usage = (body.usage ?? {}) as { input_tokens?: number; output_tokens?: number };
  return {
    id: String(body.id ?? ''),
    model: String(body.model ?? ''),
    content: (body.content ?? []) as CResponse['content'],
    stop_reason: (body.stop_reason ?? null) as CResponse['stop_reason'],
    usage: { input_tokens: usage.input_tokens ?? 0, output_tokens: usage.output_tokens ?? 0 },
  };
}

export function responseFromCanonical(res: CResponse): Record<string, unknown> {
  return {
    id: res.id.startsWith('msg_') ? res.id : `msg_${res.id}`,
    type: 'message',
    role: 'assistant',
    model: res.model,
    content: res.content,
    stop_reason: res.stop_reason,
    stop_sequence: null,
    usage: res.usage,
  };
}

/** Upstream Anthropic events are canonical already; `ping` and unknown events are dropped. */
export function parseEvent(_event: string | null, data: string): CEvent[] {
  const e = JSON.parse(data) as CEvent | { type: string };
  return [
    'message_start',
    'content_block_start',
    'content_block_delta',
    'content_block_stop',
    'message_delta',
    'message_stop',
  ].includes(e.type)
    ? [e as CEvent]
    : [];
}

export class AnthropicEmitter {
  emit(e: CEvent): string {
    if (e.type === 'message_start') {
      return formatSse('message_start', {
        type: 'message_start',
        message: {
          id: e.message.id,
          type: 'message',
          role: 'assistant',
          model: e.message.model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: e.message.usage,
        },
      });
    }
    if (e.type === 'message_delta')
      return formatSse('message_delta', { ...e, delta: { ...e.delta, stop_sequence: null } });
    return formatSse(e.type, e);
  }

  end(): string {
    return '';
  }
}
