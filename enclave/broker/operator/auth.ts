import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError, AuthenticationError } from '../../../core/errors.ts';
import { shared } from '../../../core/fastify-shared.ts';
import type { OidcAuthenticator } from '../../../core/oidc.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import type { Queryable } from '../../../core/sql.ts';
import { capabilitiesOf, type BrokerCapability } from './grants.ts';

// The operator listener's authentication (spec: Authentication, "Operator to the enclave broker"): a
// bearer token of --local-issuer (OIDC discovery + JWKS, core/oidc.ts), its org read from --org-claim.
// Every /api/v1 path authenticates first, routed or not (an unknown path is 401 to an anonymous
// caller, never 404). Authorization is from the enclave's own grants (grants.ts).

export const operatorAuth = shared(
  'broker-operator-auth',
  async (app: FastifyInstance, o: { oidc: OidcAuthenticator }) => {
    app.addHook('onRequest', async (req: FastifyRequest) => {
      if (!req.url.startsWith('/api/v1/') && req.url !== '/api/v1') return;
      const header = req.headers.authorization;
      const token =
        typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : '';
      if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
      try {
        req.principal = await o.oidc.authenticate(token);
      } catch (err) {
        if (err instanceof AuthenticationError)
          throw new ApiError(PROBLEMS.unauthenticated, err.message, { cause: err });
        throw err;
      }
    });
  },
);

/** The caller's capabilities over its org, or 403 naming what it lacks. */
export async function requireCapability(
  db: Queryable,
  req: FastifyRequest,
  capability: BrokerCapability,
): Promise<Set<BrokerCapability>> {
  const p = req.principal;
  if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
  const held = await capabilitiesOf(db, p);
  if (!held.has(capability))
    throw new ApiError(PROBLEMS.forbidden, `requires ${capability} over org ${p.orgId || '(none)'} in this enclave`);
  return held;
}
