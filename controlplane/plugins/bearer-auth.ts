import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { AgentOperatorIssuer } from '../auth/agent-operator-issuer.ts';
import type { OidcAuthenticator } from '../../core/oidc.ts';
import type { ServiceAccountStatus } from '../auth/service-account-status.ts';
import { ApiError, AuthenticationError, PROBLEMS } from '../errors.ts';
import { shared } from '../../core/fastify-shared.ts';

export interface BearerAuthOptions extends Record<string, unknown> {
  oidc: OidcAuthenticator;
  agentIssuer: AgentOperatorIssuer | null;
  accountStatus: ServiceAccountStatus;
}

// Every /api/v1 path, routed or not, authenticates first: an unknown path answers 401 to a caller
// without a valid token, never 404, so the surface cannot be mapped anonymously. Shared, so the hook
// runs for the whole server (spec: Authentication).
export const bearerAuth = shared('controlplane-bearer-auth', async (app: FastifyInstance, o: BearerAuthOptions) => {
  app.addHook('onRequest', async (req: FastifyRequest) => {
    if (!req.url.startsWith('/api/v1/') && req.url !== '/api/v1') return;
    const header = req.headers.authorization;
    const token =
      typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : '';
    if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
    try {
      // The authenticator that accepts a token fixes its kind: a token of our agent-operator issuer is
      // verified by it alone (fail closed, never retried as an OIDC token), any other by the OIDC issuer.
      req.principal = o.agentIssuer?.claims(token)
        ? await o.agentIssuer.authenticate(token)
        : await o.oidc.authenticate(token);
      if (req.principal.kind === 'service' && (await o.accountStatus.disabled(req.principal.subject)))
        throw new AuthenticationError('service account disabled');
    } catch (err) {
      if (err instanceof AuthenticationError) throw new ApiError(PROBLEMS.unauthenticated, err.message, { cause: err });
      throw err;
    }
  });
});
