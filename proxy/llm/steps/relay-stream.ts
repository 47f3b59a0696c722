import type { Readable } from 'node:stream';
import { MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { FinalEventGuard } from '../final-event.ts';
import type { CallContext } from '../context.ts';
import { relayBody, type ChunkFilter } from '../relay-body.ts';
import { relayGated } from '../relay-gated.ts';
import { streamToolGate } from '../tools/stream-formats.ts';
import { StreamTranslator } from '../translate/index.ts';
import { agentHeaders } from '../upstream.ts';
import { usageOf } from '../usage.ts';
import { deliver } from './audit.ts';
import { finishStreamInspection, inspectResponse, startStreamInspection } from './inspect-response.ts';
import { rememberRefusals } from './refused-results.ts';

// SSE: events go to the agent as they arrive [translated]; the same bytes feed the response pipeline
// as they pass (pipeline/stream-inspection.ts: scanned in stretches, so at the end only the last one
// is left; with an inert policy, or none, they are kept and inspected at the end); the final event waits for the audit record (final-event.ts). With a tool policy
// (ctx.decideTool), a tool call and what follows it wait for the call's decision
// (tools/stream-gate.ts, relay-gated.ts): upstream → [translator] → tool gate → [final-event guard].

export async function relayStream(ctx: CallContext): Promise<void> {
  const { res } = ctx;
  const answer = ctx.answer!;
  const format = ctx.format!;
  const upstreamFormat = ctx.upstreamFormat!;
  if (ctx.decideTool !== null && answer.unreadable !== null) {
    // A coding the proxy cannot undo (a stacked `gzip, gzip`, which the agent's fetch may undo): the
    // gate would see no event in it and let every byte through. Calls that cannot be found cannot be
    // decided: nothing of it goes out (fail closed), as for a plain answer.
    ctx.error = `tool policy: the stream is in a content coding the proxy cannot read (content coding ${answer.unreadable})`;
    ctx.d.log.warn({ request_id: ctx.id }, ctx.error);
    const body = answer.body as Readable;
    body.on('error', () => undefined); // the upstream released: its abort is no failure of ours
    body.destroy();
    throw new Refusal(ERRORS.upstreamFailed, null);
  }
  ctx.status = answer.statusCode;
  res.writeHead(answer.statusCode, agentHeaders(answer.headers));
  res.flushHeaders();
  const translator = upstreamFormat !== format ? new StreamTranslator(upstreamFormat, format) : null;
  const guard = ctx.audit ? new FinalEventGuard(format) : null;
  const stream = await startStreamInspection(ctx);
  const chunks: Buffer[] = [];
  const copy = stream ?? chunks;
  let tail: Buffer;
  if (ctx.decideTool === null) {
    await relayBody(ctx, copy, translator || guard ? new StreamOut(translator, guard) : null, 'upstream stream failed');
    tail = translator && !res.destroyed ? Buffer.from(translator.end()) : Buffer.alloc(0);
    if (guard) tail = Buffer.concat([guard.push(tail), guard.rest()]);
  } else {
    const gate = streamToolGate(format, ctx.decideTool, {
      disclosure: ctx.d.options.inspectionDisclosure,
      onRefused: ({ answerId, call, message, custom }) => rememberRefusals(ctx, answerId, [{ call, message, custom }]),
    });
    const translation = translator && {
      push: (chunk: Buffer) => Buffer.from(translator.push(chunk)),
      end: () => Buffer.from(translator.end()),
    };
    await relayGated(ctx, copy, translation, gate, guard, 'upstream stream failed');
    tail = guard ? guard.rest() : Buffer.alloc(0);
    if (gate.overflowed && !res.destroyed) {
      // Past what may be held, the answer is cut where the gate stopped (the calls it held refused).
      ctx.error = `the answer held for tool-call decisions exceeded ${MAX_BODY_BYTES} bytes; cut there`;
      res.destroy();
    }
  }
  const body = stream ? stream.body : Buffer.concat(chunks);
  ctx.usage = usageOf(upstreamFormat, body, true);
  if (stream) await finishStreamInspection(ctx, stream);
  else await inspectResponse(ctx, body);
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
