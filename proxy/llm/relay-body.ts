import type { ServerResponse } from 'node:http';
import { MAX_BODY_BYTES } from '../../pipeline/engine.ts';
import { closedForSendStall } from '../../core/server-limits.ts';
import type { CallContext } from './context.ts';
import { upstreamFailed } from './steps/forward.ts';

// Writing an answer to the agent: the one loop that relays an upstream body as it arrives (streams and
// pass-through answers) keeping a copy for the response pipeline, and send(), which bounds an agent
// that stops reading.

/** Turns upstream bytes into what goes to the agent (a translator, the final-event guard, a tool policy). */
export interface ChunkFilter {
  push(chunk: Buffer): Buffer;
}

/** How a relay ended: the upstream body ran out, the agent left or stopped reading, or the upstream failed. */
export type Relayed = 'done' | 'gone' | 'failed';

/**
 * Relays the upstream answer's body to the agent as it comes, through `filter` when given, keeping its
 * first MAX_BODY_BYTES in `copy` for the response pipeline. Headers are sent: a failed upstream ends in
 * a destroyed response (the agent sees the answer cut short, never one left open), `what` in its record.
 */
export async function relayBody(
  ctx: CallContext,
  copy: { push(chunk: Buffer): unknown },
  filter: ChunkFilter | null,
  what: string,
): Promise<Relayed> {
  const res = ctx.res;
  const idle = ctx.d.options.idleTimeout;
  let kept = 0;
  try {
    for await (const chunk of ctx.answer!.body) {
      ctx.responseBytes += chunk.length;
      if (kept + chunk.length <= MAX_BODY_BYTES) {
        copy.push(chunk);
        kept += chunk.length;
      }
      const out = filter === null ? chunk : filter.push(chunk);
      const sent = out.length > 0 ? await send(res, out, idle) : res.destroyed ? 'closed' : 'sent';
      if (sent !== 'sent') {
        agentGone(ctx, sent);
        return 'gone';
      }
    }
  } catch (err) {
    upstreamFailed(ctx, err as Error, what);
    res.destroy();
    return 'failed';
  }
  return 'done';
}

/**
 * The agent's side of the answer ended before its last byte: the agent stopped reading (nothing taken
 * for --idle-timeout, by this call's own bound or the listener's, core/server-limits.ts) or left.
 * Said in the record; leaving the relay loop releases the upstream (undici's body is destroyed and
 * `abort` fires on the response's close), so no upstream connection waits on an agent that reads nothing.
 */
export function agentGone(ctx: CallContext, how: 'closed' | 'stalled'): void {
  const d = ctx.d;
  // A cut call (LlmProxy.recheck): its record says why.
  if (ctx.cut !== null) {
    ctx.res.destroy();
    return;
  }
  const stalled = how === 'stalled';
  ctx.error = stalled
    ? `the agent stopped reading: none of the answer was taken for ${d.options.idleTimeout} ms (--idle-timeout); ` +
      `answer cut after ${ctx.responseBytes} upstream bytes`
    : 'the agent closed the connection before the answer was delivered';
  if (stalled) d.metrics.agentStalls.inc();
  d.log.info({ request_id: ctx.id, agent_id: ctx.identity?.agentId, stalled }, ctx.error);
  ctx.res.destroy();
}

/**
 * Writes a chunk, waiting for the agent's socket to drain when its buffer is full: 'sent', 'closed' when
 * the response closed first, 'stalled' when the agent took nothing for `stallMs` (the response is then
 * destroyed, which releases the upstream feeding it).
 */
export async function send(
  res: ServerResponse,
  chunk: Buffer,
  stallMs: number,
): Promise<'sent' | 'closed' | 'stalled'> {
  if (res.destroyed) return 'closed';
  const socket = res.socket;
  if (res.write(chunk)) return 'sent';
  return new Promise((resolve) => {
    const done = (how: 'sent' | 'closed' | 'stalled') => {
      clearTimeout(timer);
      res.off('drain', drained);
      res.off('close', closed);
      resolve(how);
    };
    const drained = () => done('sent');
    // Closed by the listener's own send-stall bound (core/server-limits.ts) is a stall too.
    const closed = () => done(closedForSendStall(socket) ? 'stalled' : 'closed');
    // Progress (a write completing) makes node emit 'drain' only once the whole buffer is gone, so the
    // bound restarts while the buffered bytes shrink: a slow reader that keeps reading is not cut.
    let left = res.writableLength;
    const timer = setTimeout(function check() {
      if (res.writableLength < left) {
        left = res.writableLength;
        timer.refresh();
        return;
      }
      done('stalled');
      res.destroy();
    }, stallMs);
    res.on('drain', drained);
    res.on('close', closed);
  });
}
