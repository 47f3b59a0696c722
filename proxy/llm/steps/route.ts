import { own } from '../../../core/own.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { INFERENCE_ROUTES, isNormalApiPath, passThroughFormat } from '../formats.ts';

// Which API: the route, its wire format, the format the upstream speaks (--translate), and what the
// body may be (uncompressed; JSON on an inference route, where no content-type is read as JSON).

const JSON_TYPE = /^application\/(?:[\w.+-]*\+)?json\s*(?:;|$)/i;

export function route(ctx: CallContext): void {
  const req = ctx.req;
  const options = ctx.d.options;
  const inferenceFormat = req.method === 'POST' ? own(INFERENCE_ROUTES, ctx.path) : undefined;
  // Only the providers' /v1 APIs, in normal form (formats.ts: the platform key never travels to
  // `/v1/../admin`, and `/v1/messages/` is no way around the inference route's checks).
  // An inference route is one of INFERENCE_ROUTES' own paths, each in normal form: no need to check.
  if (inferenceFormat === undefined && !isNormalApiPath(ctx.path)) {
    throw new Refusal(ERRORS.notFound, 'no such route (not a provider /v1 path in normal form)');
  }
  const coding = req.headers['content-encoding'];
  if (coding !== undefined && coding.trim().toLowerCase() !== 'identity') {
    throw new Refusal(ERRORS.encodedBody, `content-encoding ${coding} refused`, { connection: 'close' });
  }
  const format = inferenceFormat ?? passThroughFormat(ctx.path, req.headers);
  ctx.format = format;
  ctx.inference = inferenceFormat !== undefined;
  ctx.upstreamFormat =
    inferenceFormat && options.translate && format !== options.translateUpstreamFormat
      ? options.translateUpstreamFormat
      : format;
  const contentType = req.headers['content-type'];
  if (inferenceFormat && contentType !== undefined && !JSON_TYPE.test(contentType)) {
    throw new Refusal(ERRORS.unsupportedMediaType, `content-type ${contentType} refused`);
  }
}
