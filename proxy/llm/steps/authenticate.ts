import type { TLSSocket } from 'node:tls';
import { orgFlag } from '../../../pipeline/policy/snapshot.ts';
import type { AgentIdentity } from '../auth.ts';
import type { CallContext } from '../context.ts';
import { AuthError, ERRORS, Refusal } from '../errors.ts';

// Who is calling (spec: Authentication): the gateway's signed identity header (it names this request's
// method and URL), the platform JWT, or the agent's identity certificate.

const UNAUTHENTICATED_HEADERS = { 'www-authenticate': 'Bearer' };

export async function authenticate(ctx: CallContext): Promise<void> {
  const d = ctx.d;
  let identity: AgentIdentity;
  try {
    identity = await d.auth.authenticate(ctx.req.headers, ctx.req.socket as TLSSocket, {
      method: ctx.req.method ?? '',
      url: ctx.req.url ?? '',
    });
  } catch (err) {
    if (!(err instanceof AuthError)) throw err;
    ctx.snapshot = d.snapshot();
    d.metrics.authFailures.inc({ reason: err.reason });
    d.log.warn(
      {
        err,
        reason: err.reason,
        request_id: ctx.id,
        path: ctx.path,
        agent_id: err.identity?.agentId,
        org_id: err.identity?.orgId,
      },
      'agent authentication failed',
    );
    // A token the issuer signed names its agent even when refused (expired, say): audited as that
    // agent's. Without a verified signature nothing names the caller, and no org's log takes the
    // record (docs/decisions.md, "Every refusal is audited"): the log line and the metric above are
    // its trace.
    if (err.identity) identify(ctx, err.identity);
    throw new Refusal(ERRORS.unauthenticated, `agent authentication failed: ${err.message}`, UNAUTHENTICATED_HEADERS);
  }
  // The call's one snapshot is the one current when its caller is known: a reload while the token was
  // verified (a suspension, a containment) applies to this call.
  ctx.snapshot = d.snapshot();
  identify(ctx, identity);
}

/** The call is that agent's from here on: its record goes to its org's log, if the org audits. */
export function identify(ctx: CallContext, identity: AgentIdentity): void {
  ctx.identity = identity;
  ctx.audit = orgFlag(ctx.snapshot, identity.orgId, 'audit:llm');
  ctx.inspect = orgFlag(ctx.snapshot, identity.orgId, 'inspect:llm');
}
