import type { WireFormat } from '../../../pipeline/policy/snapshot.ts';
import { AnthropicToolStream } from './stream-anthropic.ts';
import { type StreamGateOptions, StreamGate } from './stream-gate.ts';
import { ChatToolStream } from './stream-openai-chat.ts';
import { ResponsesToolStream } from './stream-openai-responses.ts';
import type { Decide } from './types.ts';

// The tool gate for a stream in the agent's wire format.

export function streamToolGate(format: WireFormat, decide: Decide, options: StreamGateOptions = {}): StreamGate {
  const side =
    format === 'anthropic-messages'
      ? new AnthropicToolStream()
      : format === 'openai-chat'
        ? new ChatToolStream()
        : new ResponsesToolStream();
  return new StreamGate(side, decide, options);
}
