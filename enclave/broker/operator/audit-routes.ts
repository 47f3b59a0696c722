import type { FastifyInstance } from 'fastify';
import { auditReadRoutes } from '../../../audit-wal/read-routes.ts';
import { auditScopeOf } from '../../../audit-wal/scope.ts';
import type { AuditStore } from '../../../audit-wal/store.ts';
import { ApiError } from '../../../core/errors.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import { streamGuardDeps } from '../../../core/stream-guard.ts';
import type { BrokerDeps } from '../deps.ts';
import { capabilitiesOf, onGrantsChanged } from './grants.ts';

// The enclave's own audit read API on the operator listener (spec: Audit read personas, "The enclave
// broker authorizes its own /api/v1/audit/*…"): the routes the control plane serves
// (audit-wal/read-routes.ts) over the enclave's sovereign store (--audit-dsn), authorized only from the
// enclave-local grants (grants.ts) through the shared persona rule (audit-wal/scope.ts):
//   audit:read:all   the caller's org, every actor (admin, auditor)
//   audit:read       the caller's org, its own records only (member)
//   neither          403
// No platform persona: the broker never aggregates across enclaves, and `org` is ignored. The store
// holds what the broker writes (audit_events) and what the enclave's llmproxy ships (llm_audit_log, read
// as records of action inference.request). An open stream ends when its caller's grant does.
//   no --audit-dsn   404 Problem naming the flag (the audit goes to stdout; there is nothing to read)

export function brokerAuditRoutes(deps: BrokerDeps, store: AuditStore) {
  const { db, options } = deps;
  return auditReadRoutes({
    store,
    scopeOf: async (req, filters) => {
      const p = req.principal;
      if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
      const scope = auditScopeOf(p, { capabilities: await capabilitiesOf(db, p) }, filters);
      if (!scope)
        throw new ApiError(
          PROBLEMS.forbidden,
          `requires audit:read or audit:read:all over org ${p.orgId || '(none)'} in this enclave`,
        );
      return scope;
    },
    wake: (recheck) => onGrantsChanged(db, recheck),
    llm: true,
    pollMs: options.auditStreamPollMs,
    heartbeatMs: 15_000,
    guard: streamGuardDeps(deps.registry, deps.log, options.streamRecheckMs, options.idleTimeout, 'broker'),
  });
}

/** Without an audit store the routes answer 404, saying why (after authentication, like every /api/v1 path). */
export async function noAuditStore(api: FastifyInstance): Promise<void> {
  const refuse = async () => {
    throw new ApiError(
      PROBLEMS.notFound,
      'this broker has no audit store (--audit-dsn): its audit goes to stdout and there is nothing to read here',
    );
  };
  api.get('/audit/events', refuse);
  api.get('/audit/stream', refuse);
}
