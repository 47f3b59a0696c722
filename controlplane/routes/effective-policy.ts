import type { FastifyInstance } from 'fastify';
import { orgFlag, policyLayers, resolveSnapshotSetting, WIRE_FORMATS } from '../../pipeline/policy/snapshot.ts';
import { governedSetting } from '../../pipeline/policy/snapshot-governance.ts';
import { governedUpstream } from '../../pipeline/policy/governance.ts';
import { resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { agentSnapshot } from '../../pipeline/policy/store-snapshot.ts';
import type { ChangeDeps } from '../audited-change.ts';
import { agentOrg, checkedAgent } from '../authz/targets.ts';
import { reportSkipped } from '../skipped-rows.ts';
import { FLAGS } from './feature-flags.ts';
import { ANY, BOOLEAN, pathParams, STRING, viewSchema } from '../../core/schemas.ts';

// The effective LLM policy of an agent (llm-content-policy.md: Policy hierarchy): the proxy's own resolver
// over the state the agent's enclave receives, under agents:manage over the agent's org. `credential_mode`
// and `upstream` are what llmproxy uses: the settings with the governance llm_policy's fields
// (snapshot-governance.ts), `upstream` per wire format.

const EFFECTIVE_VIEW = viewSchema('effectivePolicyView', {
  agent: STRING,
  org_id: STRING,
  group_id: STRING,
  flags: { type: 'object', additionalProperties: BOOLEAN },
  policy: ANY,
  credential_mode: ANY,
  downstream_url: ANY,
  upstream: ANY,
  skipped: ANY,
});

export function effectivePolicyRoutes(deps: ChangeDeps) {
  const { db } = deps;
  const agentsManage = { requiredCapability: 'agents:manage', capabilityTarget: agentOrg(db) } as const;

  return async (api: FastifyInstance) => {
    api.get(
      '/agents/:id/effective-policy',
      { config: agentsManage, schema: { params: pathParams('id'), response: { 200: EFFECTIVE_VIEW } } },
      async (req) => {
        const agent = await checkedAgent(db, req, (req.params as { id: string }).id);
        const snapshot = await agentSnapshot(db, agent.org_id, agent);
        reportSkipped(deps, `agent:${agent.uid}`, snapshot.skipped);
        const group = agent.group_id || null;
        const policy = resolvePolicy(policyLayers(snapshot, agent.org_id, group, agent.uid));
        return {
          agent: agent.uid,
          org_id: agent.org_id,
          group_id: agent.group_id,
          flags: Object.fromEntries(FLAGS.map((f) => [f, orgFlag(snapshot, agent.org_id, f)])),
          policy,
          credential_mode: governedSetting(snapshot, 'credential_mode', agent.org_id, group, agent.uid) ?? 'platform',
          downstream_url: resolveSnapshotSetting(snapshot, 'downstream_url', agent.org_id, group, agent.uid),
          upstream: upstreamView(governedSetting(snapshot, 'upstream', agent.org_id, group, agent.uid) ?? {}),
          skipped: snapshot.skipped,
        };
      },
    );
  };
}

/** The upstream map per wire format (a governance map may name a provider for its formats). */
function upstreamView(map: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of WIRE_FORMATS) {
    const url = governedUpstream(map, f);
    if (url !== undefined) out[f] = url;
  }
  return out;
}
