import { FinalEventGuard } from '../final-event.ts';
import type { CallContext } from '../context.ts';
import { relayBody, type ChunkFilter } from '../relay-body.ts';
import { StreamTranslator } from '../translate/index.ts';
import { agentHeaders } from '../upstream.ts';
import { usageOf } from '../usage.ts';
import { deliver } from './audit.ts';
import { inspectResponse } from './inspect-response.ts';

// SSE: events go to the agent as they arrive [translated]; the same bytes feed the response pipeline
// at the end; the final event waits for the audit record (final-event.ts).

export async function relayStream(ctx: CallContext): Promise<void> {
  const { res } = ctx;
  const answer = ctx.answer!;
  const format = ctx.format!;
  const upstreamFormat = ctx.upstreamFormat!;
  ctx.status = answer.statusCode;
  res.writeHead(answer.statusCode, agentHeaders(answer.headers));
  res.flushHeaders();
  const translator = upstreamFormat !== format ? new StreamTranslator(upstreamFormat, format) : null;
  const guard = ctx.audit ? new FinalEventGuard(format) : null;
  const copy: Buffer[] = [];
  await relayBody(ctx, copy, translator || guard ? new StreamOut(translator, guard) : null, 'upstream stream failed');
  let tail = translator && !res.destroyed ? Buffer.from(translator.end()) : Buffer.alloc(0);
  if (guard) tail = Buffer.concat([guard.push(tail), guard.rest()]);
  const body = Buffer.concat(copy);
  ctx.usage = usageOf(upstreamFormat, body, true);
  await inspectResponse(ctx, body);
  if (res.destroyed) return;
  const delivered = await deliver(ctx, () => {
    if (tail.length > 0) res.write(tail);
    res.end();
  });
  // The final event never leaves without its record: the agent sees a stream cut short.
  if (!delivered) res.destroy();
}

/** A stream's bytes on their way out: translated to the agent's format, then past the final-event guard. */
class StreamOut implements ChunkFilter {
  #translator: StreamTranslator | null;
  #guard: FinalEventGuard | null;

  constructor(translator: StreamTranslator | null, guard: FinalEventGuard | null) {
    this.#translator = translator;
    this.#guard = guard;
  }

  push(chunk: Buffer): Buffer {
    const translated = this.#translator ? Buffer.from(this.#translator.push(chunk)) : chunk;
    return this.#guard ? this.#guard.push(translated) : translated;
  }
}
