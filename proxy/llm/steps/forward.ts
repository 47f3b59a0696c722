import { performance } from 'node:perf_hooks';
import type { Dispatcher } from 'undici';
import { governedUpstream } from '../../../pipeline/policy/governance.ts';
import { resolveSnapshotSetting } from '../../../pipeline/policy/snapshot.ts';
import { governedSetting } from '../../../pipeline/policy/snapshot-governance.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';
import { routeOf } from '../translate/index.ts';
import {
  DEFAULT_UPSTREAMS,
  readableAnswer,
  upstreamHeaders,
  upstreamTarget,
  upstreamTimeoutPhase,
} from '../upstream.ts';

// The call to the upstream (undici; upstream.ts), at the caller's upstream: the snapshot's `upstream`
// for the format (with the governance llm_policy's `upstream`, snapshot-governance.ts), else its
// `downstream_url`, else --upstream-default, else the provider. The agent leaving aborts it.

export async function forward(ctx: CallContext): Promise<void> {
  const { req, res, d } = ctx;
  const { orgId, groupId, agentId } = ctx.identity!;
  const format = ctx.format!;
  const upstreamFormat = ctx.upstreamFormat!;
  const translated = upstreamFormat !== format;
  const upstreams =
    ctx.governance === null
      ? resolveSnapshotSetting(ctx.snapshot, 'upstream', orgId, groupId, agentId)
      : governedSetting(ctx.snapshot, 'upstream', orgId, groupId, agentId);
  const base =
    (upstreams ? governedUpstream(upstreams, upstreamFormat) : undefined) ??
    resolveSnapshotSetting(ctx.snapshot, 'downstream_url', orgId, groupId, agentId) ??
    (d.options.upstreamDefault || DEFAULT_UPSTREAMS[upstreamFormat]);
  const target = upstreamTarget(base);
  const url = req.url ?? '/';
  const query = url.includes('?') ? url.slice(url.indexOf('?')) : '';
  const upstreamPath = target.basePath + (translated ? routeOf(upstreamFormat) + query : url);
  const sendsBody = req.method !== 'GET' && req.method !== 'HEAD';
  const started = performance.now();
  const abort = ctx.upstreamAbort;
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  const length = sendsBody ? ctx.body.length : null;
  const headers = upstreamHeaders(upstreamFormat, req.headers, ctx.credential!, length, translated);
  let upstream: Dispatcher.ResponseData;
  try {
    upstream = await d.dispatcher.request({
      origin: target.origin,
      path: upstreamPath,
      method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
      headers,
      body: sendsBody ? ctx.body : undefined,
      signal: abort.signal,
    });
  } catch (err) {
    ctx.upstreamMs = performance.now() - started;
    upstreamFailed(ctx, err as Error, 'upstream request failed', target.origin);
    throw new Refusal(ERRORS.upstreamFailed, null);
  }
  ctx.upstreamMs = performance.now() - started;
  ctx.upstreamStatus = upstream.statusCode;
  d.metrics.upstream.observe({ format }, ctx.upstreamMs / 1000);

  const answer = readableAnswer(upstream, req.method ?? 'GET');
  if (answer.unreadable !== null && ctx.inspect) {
    ctx.failOpen = true;
    ctx.failures.push({ phase: 'response', inspector: 'all', reason: 'content_coding' });
    d.log.warn(
      {
        request_id: ctx.id,
        content_encoding: answer.unreadable,
      },
      'inspection failopen: the upstream answer is in a content coding we cannot read',
    );
  }
  ctx.answer = answer;
}

/**
 * An upstream failure, named in the call's record (`error`) and the log; a dead upstream cut by one of
 * the dispatcher's timers (upstream.ts) says which, and is counted.
 */
export function upstreamFailed(ctx: CallContext, err: Error, what: string, upstream?: string): void {
  const d = ctx.d;
  // A cut call (LlmProxy.recheck) aborted its upstream itself: its record says why.
  if (ctx.cut !== null) return;
  const phase = upstreamTimeoutPhase(err);
  if (phase !== null) d.metrics.upstreamTimeouts.inc({ phase });
  const reason =
    phase === 'headers'
      ? `no response headers within ${d.options.upstreamTimeout} ms (--upstream-timeout)`
      : phase === 'idle'
        ? `nothing received for ${d.options.upstreamIdleTimeout} ms (--upstream-idle-timeout)`
        : err.message;
  ctx.error = `${what}: ${reason}`;
  d.log.warn({ request_id: ctx.id, upstream, timeout: phase, err }, what);
}
