import type { FastifyInstance } from 'fastify';
import type { AgentOperatorIssuer } from '../auth/agent-operator-issuer.ts';

// The agent-operator issuer's discovery document and keys, for whoever verifies its tokens.
export function agentIssuerDiscovery(issuer: AgentOperatorIssuer) {
  return async (app: FastifyInstance) => {
    app.get('/.well-known/openid-configuration', async () => issuer.discovery());
    app.get('/.well-known/jwks.json', async () => issuer.jwks());
  };
}
