import { MAX_BODY_BYTES } from '../../pipeline/engine.ts';
import type { CallContext } from './context.ts';
import { type ChunkFilter, type Relayed, agentGone, send } from './relay-body.ts';
import { upstreamFailed } from './steps/forward.ts';
import type { StreamGate } from './tools/stream-gate.ts';

// Relaying a stream through the tool gate (tools/stream-gate.ts). Unlike relayBody's one loop, two run
// side by side, because what goes out no longer follows what comes in: a decision (or a keep-alive)
// releases bytes while the upstream keeps streaming, or while it sends nothing at all.
//
//   upstream ─▶ reader: copy, [translate] ─▶ gate.push ─┐
//                                                         gate ─▶ writer: next() ─▶ [after] ─▶ send()
//
// The reader takes the next upstream chunk only once the writer has sent what is ready (the agent's
// backpressure reaches the upstream as before); what the gate holds is bounded by the gate. The agent
// leaving cancels the gate (no decision is awaited any more, no timer is left).

/** What turns the upstream's bytes into the agent's format before the gate (a translator). */
export interface StreamTranslation {
  push(chunk: Buffer): Buffer;
  /** What the translation still has once the upstream ended. */
  end(): Buffer;
}

export async function relayGated(
  ctx: CallContext,
  copy: { push(chunk: Buffer): unknown },
  translation: StreamTranslation | null,
  gate: StreamGate,
  after: ChunkFilter | null,
  what: string,
): Promise<Relayed> {
  const res = ctx.res;
  const idle = ctx.d.options.idleTimeout;
  let gone: 'closed' | 'stalled' | null = null;
  let sending = false;
  let idleWaiters: (() => void)[] = [];
  const wakeReader = () => {
    const waiters = idleWaiters;
    idleWaiters = [];
    for (const w of waiters) w();
  };
  const onClose = () => {
    if (res.writableFinished) return;
    gone ??= 'closed';
    gate.cancel();
    wakeReader();
  };
  res.on('close', onClose);

  const writer = async (): Promise<void> => {
    for (let out = await gate.next(); out !== null; out = await gate.next()) {
      const bytes = after === null ? out : after.push(out);
      sending = true;
      const sent = bytes.length > 0 ? await send(res, bytes, idle) : res.destroyed ? 'closed' : 'sent';
      sending = false;
      if (sent !== 'sent') {
        gone ??= sent;
        gate.cancel();
        break;
      }
      wakeReader();
    }
    wakeReader();
  };

  const reader = async (): Promise<'done' | 'failed' | 'gone'> => {
    let kept = 0;
    try {
      for await (const chunk of ctx.answer!.body) {
        if (gone !== null) return 'gone';
        ctx.responseBytes += chunk.length;
        if (kept + chunk.length <= MAX_BODY_BYTES) {
          copy.push(chunk);
          kept += chunk.length;
        }
        gate.push(translation === null ? chunk : translation.push(chunk));
        if (gate.overflowed) return 'done';
        // Backpressure: the next chunk once what is ready went out.
        while (gone === null && (sending || gate.readyBytes > 0)) await new Promise<void>((r) => idleWaiters.push(r));
        if (gone !== null) return 'gone';
      }
      if (translation !== null) gate.push(translation.end());
      gate.end();
      return 'done';
    } catch (err) {
      // The agent left: its response's close aborted the upstream (steps/forward.ts); not an upstream failure.
      if (gone !== null) return 'gone';
      upstreamFailed(ctx, err as Error, what);
      gate.cancel();
      res.destroy();
      return 'failed';
    }
  };

  const [read] = await Promise.all([reader(), writer()]);
  res.off('close', onClose);
  if (gone !== null) {
    agentGone(ctx, gone);
    return 'gone';
  }
  return read;
}
