import type { CallContext } from '../context.ts';
import { relayPassThrough } from './relay-pass-through.ts';
import { relayPlain } from './relay-plain.ts';
import { relayStream } from './relay-stream.ts';

// The answer's way back, by its kind: an event stream relayed as it arrives, another route's answer
// passed through as it arrives, an inference call's plain answer held until inspected.

export function relay(ctx: CallContext): Promise<void> {
  const answer = ctx.answer!;
  if (String(answer.headers['content-type'] ?? '').startsWith('text/event-stream')) return relayStream(ctx);
  if (!ctx.inference) return relayPassThrough(ctx);
  return relayPlain(ctx);
}
