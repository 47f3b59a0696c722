import { topLevel } from '../../pipeline/json-view.ts';
import type { WireFormat } from '../../pipeline/policy/snapshot.ts';

// Token usage as the upstream reports it, for the audit record: from the JSON body of a plain response,
// or from the events of a stream (Anthropic message_start/message_delta, OpenAI's final chunk with
// `usage`, the responses API's response.completed).

export interface TokenUsage {
  input_tokens: number | null;
  output_tokens: number | null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function fromUsage(u: unknown, into: TokenUsage): void {
  if (u === null || typeof u !== 'object') return;
  const r = u as Record<string, unknown>;
  const input = num(r.input_tokens) ?? num(r.prompt_tokens);
  const output = num(r.output_tokens) ?? num(r.completion_tokens);
  if (input !== null) into.input_tokens = input;
  if (output !== null) into.output_tokens = output;
}

const MAX_PARSE = 4 * 1024 * 1024;

export function usageOf(_format: WireFormat, body: Buffer, streamed: boolean): TokenUsage | null {
  const usage: TokenUsage = { input_tokens: null, output_tokens: null };
  try {
    if (!streamed) {
      // Only the top-level `usage` value is parsed, wherever it sits in the body.
      const value = topLevel(body, 'usage')?.value;
      if (!value || value.end - value.start > MAX_PARSE) return null;
      fromUsage(JSON.parse(body.toString('utf8', value.start, value.end)), usage);
    } else {
      // Only events that mention usage are parsed.
      for (let at = body.indexOf('"usage"'); at >= 0; at = body.indexOf('"usage"', at + 7)) {
        const lineStart = body.lastIndexOf('data:', at);
        if (lineStart < 0) continue;
        let end = body.indexOf(0x0a, at);
        if (end < 0) end = body.length;
        let event: Record<string, unknown>;
        try {
          event = JSON.parse(body.toString('utf8', lineStart + 5, end).trim()) as Record<string, unknown>;
        } catch {
          continue;
        }
        fromUsage(event.usage, usage);
        fromUsage((event.message as Record<string, unknown> | undefined)?.usage, usage);
        fromUsage((event.response as Record<string, unknown> | undefined)?.usage, usage);
      }
    }
  } catch {
    return null;
  }
  return usage.input_tokens === null && usage.output_tokens === null ? null : usage;
}
