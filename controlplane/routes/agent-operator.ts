import type { FastifyInstance } from 'fastify';
import type { AgentOperatorIssuer } from '../auth/agent-operator-issuer.ts';
import { PATH_ORG } from '../authz/targets.ts';
import { INTEGER, pathParams, STRING, viewSchema } from '../../core/schemas.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { getAgent } from '../store/agents.ts';

// Minting agent-operator tokens: the enclave's gateway, holding agents:manage over the agent's org,
// asks for a short-lived token that it presents on the agent's behalf (spec: "Agent operators"). Each
// mint is audited before the token is handed out.

const UID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const TOKEN_VIEW = viewSchema('agentOperatorTokenView', {
  access_token: STRING,
  token_type: STRING,
  expires_in: INTEGER,
});

export function agentOperatorRoutes(deps: ChangeDeps, issuer: AgentOperatorIssuer) {
  return async (api: FastifyInstance) => {
    api.post(
      '/orgs/:org/agents/:agent/operator-token',
      {
        config: { requiredCapability: 'agents:manage', capabilityTarget: PATH_ORG },
        schema: { params: pathParams('org', 'agent'), response: { 200: TOKEN_VIEW } },
      },
      async (req) => {
        const { org, agent } = req.params as { org: string; agent: string };
        if (!UID.test(agent)) throw new ApiError(PROBLEMS.badRequest, 'agent: not an agent id');
        // A contained agent is refused at the mint (spec: States and transitions, Agent operators).
        const state = await getAgent(deps.db, agent);
        if (state?.contained)
          throw new ApiError(
            PROBLEMS.forbidden,
            `agent ${agent} is contained: no agent-operator token is minted for it`,
          );
        if (state && state.org_id !== org) throw new ApiError(PROBLEMS.notFound, `no agent ${agent} in org ${org}`);
        return auditedChange(deps, req, 'agent-operator-token.mint', org, async () => ({
          result: await issuer.mint(org, agent),
          resource: `agent:${agent}`,
        }));
      },
    );
  };
}
