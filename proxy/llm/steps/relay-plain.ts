import type { Readable } from 'node:stream';
import { MAX_BODY_BYTES } from '../../../pipeline/engine.ts';
import type { CallContext } from '../context.ts';
import { AnswerTooLargeError, ERRORS, Refusal } from '../errors.ts';
import { eachChunk } from '../read-body.ts';
import { agentGone, send } from '../relay-body.ts';
import { decidePlainAnswer } from '../tools/plain.ts';
import { translateResponse } from '../translate/index.ts';
import { agentHeaders } from '../upstream.ts';
import { usageOf } from '../usage.ts';
import { deliver } from './audit.ts';
import { upstreamFailed } from './forward.ts';
import { inspectResponse } from './inspect-response.ts';
import { rememberRefusals } from './refused-results.ts';

// A plain answer: held, inspected (observe-only), [translated], its record written, then replayed byte
// for byte. A tool policy decides here, on the held answer, before anything is written: an answer
// with a refused call is sent rewritten (tools/plain.ts), any other as it came.

/**
 * A plain answer is held whole, up to this size: far past any model's answer, and a bound on what a
 * small compressed answer may decode to.
 */
const MAX_HELD_ANSWER_BYTES = 4 * MAX_BODY_BYTES;
/** The piece a held answer is written in: each one the agent takes is progress (send()). */
const SEND_PIECE_BYTES = 64 * 1024;

export async function relayPlain(ctx: CallContext): Promise<void> {
  const { res, d } = ctx;
  const answer = ctx.answer!;
  const format = ctx.format!;
  const upstreamFormat = ctx.upstreamFormat!;
  let body: Buffer;
  try {
    body = await collect(answer.body as Readable);
  } catch (err) {
    upstreamFailed(ctx, err as Error, 'upstream response failed mid-body');
    throw new Refusal(ERRORS.upstreamFailed, null);
  }
  ctx.responseBytes = body.length;
  ctx.usage = usageOf(upstreamFormat, body, false);
  await inspectResponse(ctx, body);
  let out = body;
  // Upstream errors are relayed as received; a successful translated answer goes back in the agent's format.
  if (upstreamFormat !== format && answer.statusCode >= 200 && answer.statusCode < 300) {
    try {
      out = translateResponse(upstreamFormat, format, body);
    } catch (err) {
      ctx.error = `response translation failed: ${(err as Error).message}`;
      d.log.warn({ err, request_id: ctx.id }, 'response translation failed');
      throw new Refusal(ERRORS.upstreamFailed, null);
    }
  }
  ctx.status = answer.statusCode;
  // A tool policy decides the answer's tool calls here, before any of it is sent (tools/plain.ts).
  if (ctx.decideTool !== null && answer.statusCode >= 200 && answer.statusCode < 300) {
    const decided = await decidePlainAnswer(format, out, ctx.decideTool, res);
    if (decided.kind === 'gone') return agentGone(ctx, 'closed');
    if (decided.kind === 'unreadable') {
      // Calls that cannot be found cannot be decided: the answer is not delivered (fail closed).
      ctx.error = `tool policy: ${decided.why}${answer.unreadable ? ` (content coding ${answer.unreadable})` : ''}`;
      d.log.warn({ request_id: ctx.id }, ctx.error);
      throw new Refusal(ERRORS.upstreamFailed, null);
    }
    if (decided.kind === 'rewritten') {
      out = decided.body;
      // A provider holding the conversation keeps the refused calls: their results go in the next turn.
      rememberRefusals(ctx, decided.answerId, decided.refusedCalls);
    }
  }
  // The whole answer is here: sent with its length (not chunked encoding), once its record is written.
  const headers = { ...agentHeaders(answer.headers), 'content-length': String(out.length) };
  const delivered = await deliver(ctx, () => res.writeHead(answer.statusCode, headers));
  if (!delivered) throw new Refusal(ERRORS.auditUnavailable, null);
  if (out.length <= SEND_PIECE_BYTES) {
    res.end(out);
    return;
  }
  // In pieces through send(), not one write: progress is a piece taken by the agent, so a slow reader
  // that keeps reading is never cut, however large the answer (one write completes only once the
  // agent has taken nearly all of it).
  for (let at = 0; at < out.length; at += SEND_PIECE_BYTES) {
    const sent = await send(res, out.subarray(at, at + SEND_PIECE_BYTES), d.options.idleTimeout);
    if (sent !== 'sent') return agentGone(ctx, sent);
  }
  res.end();
}

/** A whole body, refused past MAX_HELD_ANSWER_BYTES (the upstream's body destroyed then). */
async function collect(body: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  await eachChunk(body, (chunk) => {
    chunks.push(chunk);
    size += chunk.length;
    if (size > MAX_HELD_ANSWER_BYTES) {
      throw new AnswerTooLargeError(`upstream answer exceeds ${MAX_HELD_ANSWER_BYTES} bytes`);
    }
  });
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}
