import type { CallContext } from '../context.ts';
import { badRequest, Refusal, TranslationError } from '../errors.ts';
import { translateRequest } from '../translate/index.ts';

// --translate: an inference body in the agent's format converted to the upstream's (a 400 when it
// cannot be).

export function translate(ctx: CallContext): void {
  const format = ctx.format!;
  const upstreamFormat = ctx.upstreamFormat!;
  if (upstreamFormat === format) return;
  ctx.translatedTo = upstreamFormat;
  try {
    ctx.body = translateRequest(format, upstreamFormat, ctx.body);
  } catch (err) {
    if (err instanceof TranslationError) throw new Refusal(badRequest(err.message), err.message);
    throw err;
  }
}
