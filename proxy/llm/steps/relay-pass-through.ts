import { agentHeaders } from '../upstream.ts';
import type { CallContext } from '../context.ts';
import { relayBody } from '../relay-body.ts';
import { deliver } from './audit.ts';
import { inspectResponse } from './inspect-response.ts';

// Other routes of the provider APIs (models, files, count_tokens, batches): streamed through as they
// come; a copy feeds the response pipeline (observe-only) at the end, as for a stream.

export async function relayPassThrough(ctx: CallContext): Promise<void> {
  const { res } = ctx;
  const answer = ctx.answer!;
  ctx.status = answer.statusCode;
  res.writeHead(answer.statusCode, agentHeaders(answer.headers));
  const copy: Buffer[] = [];
  if ((await relayBody(ctx, copy, null, 'upstream response failed')) !== 'done') return;
  const body = Buffer.concat(copy);
  if (body.length > 0) await inspectResponse(ctx, body);
  // The end of the answer waits for its record, as a stream's final event does.
  if (!(await deliver(ctx, () => res.end()))) res.destroy();
}
