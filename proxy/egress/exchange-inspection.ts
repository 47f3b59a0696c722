import type { InspectionOutcome } from '../../pipeline/engine.ts';
import type { Phase } from '../../pipeline/finding.ts';
import { resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { policyLayers, type Snapshot } from '../../pipeline/policy/snapshot.ts';
import type { AgentIdentity } from '../llm/auth.ts';
import type { Flow, GatewayDeps } from './context.ts';

// A body of an exchange through the content pipeline, with the agent's content policy resolved as
// llmproxy resolves it (proxy/llm/inspection.ts: same cache key, same layers), and what an outcome
// leaves in the flow's record.

export async function inspectBody(
  deps: GatewayDeps,
  snapshot: Snapshot,
  identity: AgentIdentity,
  body: Buffer,
  phase: Phase,
): Promise<InspectionOutcome> {
  const { orgId, agentId, groupId } = identity;
  const policy = await deps.policies.get(
    orgId,
    `${agentId}\u0000${groupId ?? ''}`,
    () => resolvePolicy(policyLayers(snapshot, orgId, groupId, agentId)),
    snapshot,
  );
  return deps.engine.inspect({
    body,
    phase,
    policy,
    secrets: deps.secrets.agentSecrets(agentId),
    identity: { agentId, orgId, agentName: identity.agentName },
  });
}

/** Findings (redacted by the engine) and failures into the flow: `findings`, `inspection_failopen`, `inspection_failures`. */
export function noteOutcome(deps: GatewayDeps, flow: Flow, outcome: InspectionOutcome, phase: Phase): void {
  for (const f of outcome.findings) flow.findings.push(f);
  if (flow.findings.length > 0) flow.attrs.findings = JSON.stringify(flow.findings);
  if (outcome.failures.length > 0) {
    const before = flow.attrs.inspection_failures ? (JSON.parse(flow.attrs.inspection_failures) as unknown[]) : [];
    const now = outcome.failures.map((f) => ({ phase, inspector: f.inspector, reason: f.reason }));
    flow.attrs.inspection_failures = JSON.stringify([...before, ...now]);
  }
  if (outcome.failOpen) flow.attrs.inspection_failopen = 'true';
  if (outcome.findings.length > 0)
    deps.log.info(
      {
        flow_id: flow.id,
        agent_id: flow.identity?.agentId,
        phase,
        findings: outcome.findings,
        decision: outcome.decision,
      },
      'inspection findings',
    );
}
