import type { InspectionOutcome } from '../../pipeline/engine.ts';
import type { Phase } from '../../pipeline/finding.ts';
import { resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { policyLayers } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import type { CallContext } from './context.ts';

// What the request and response inspections share: the call's policy, resolved once from the call's
// snapshot, and how an outcome lands in the call's record.

/** The caller's resolved policy, from the cache, once per call. */
export async function policyOf(ctx: CallContext): Promise<ResolvedPolicy> {
  if (ctx.policy !== null) return ctx.policy;
  const { orgId, agentId, groupId } = ctx.identity!;
  const snapshot = ctx.snapshot;
  // The group is part of the key: for an agent the snapshot does not list, it is the token's claim.
  ctx.policy = await ctx.d.policies.get(
    orgId,
    `${agentId}\u0000${groupId ?? ''}`,
    () => resolvePolicy(policyLayers(snapshot, orgId, groupId, agentId)),
    snapshot,
  );
  return ctx.policy;
}

/** The engine's input for a body of this call. */
export async function inspect(
  ctx: CallContext,
  body: Buffer,
  phase: Phase,
  contentType?: string | null,
): Promise<InspectionOutcome> {
  const identity = ctx.identity!;
  return ctx.d.engine.inspect({
    body,
    phase,
    policy: await policyOf(ctx),
    secrets: ctx.d.secrets.agentSecrets(identity.agentId),
    identity: { agentId: identity.agentId, orgId: identity.orgId, agentName: identity.agentName },
    ...(contentType === undefined ? {} : { modelsAnywhere: { contentType } }),
  });
}

export function noteOutcome(ctx: CallContext, outcome: InspectionOutcome, phase: Phase): void {
  for (const f of outcome.findings) ctx.findings.push(f);
  for (const f of outcome.failures) ctx.failures.push({ phase, inspector: f.inspector, reason: f.reason });
  if (outcome.failOpen) ctx.failOpen = true;
  if (outcome.decision !== 'allow') ctx.decision = outcome.decision;
  if (outcome.findings.length > 0) {
    ctx.d.log.info(
      {
        request_id: ctx.id,
        agent_id: ctx.identity?.agentId,
        findings: outcome.findings,
        decision: outcome.decision,
      },
      'inspection findings',
    );
  }
}
