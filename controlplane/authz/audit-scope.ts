import type { FastifyRequest } from 'fastify';
import type { Queryable } from '../../core/sql.ts';
import type { AuditFilters } from '../../audit-wal/query.ts';
import { auditScopeOf, type AuditScope } from '../../audit-wal/scope.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { builtInRole } from './capabilities.ts';
import { callerGrants } from './capabilities.ts';
import { covers } from './guard.ts';

// The caller's audit scope in the control plane: what it holds, from the control plane's grants, handed
// to the persona rule both planes share (audit-wal/scope.ts). The result is ANDed into every query and
// every stream poll on either store.
//
//   platform:audit:read        at platform scope
//   audit:read, audit:read:all held over the caller's org (a grant covering it: org or platform scope)
//   agent-operator             what the principal agent:<uid> holds over its org (org-scoped grants)

export type { AuditScope } from '../../audit-wal/scope.ts';

export async function auditScope(db: Queryable, req: FastifyRequest, filters: AuditFilters): Promise<AuditScope> {
  const p = req.principal;
  if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
  if (p.kind === 'agent-operator') {
    const uid = p.subject.replace(/^agent:/, '');
    const { rows } = await db.query<{ role: string | null; capability: string | null }>(
      `SELECT role, capability FROM grants WHERE principal = $1 AND scope_kind = 'org' AND org_id = $2`,
      [`agent:${uid}`, p.orgId],
    );
    const capabilities = new Set<string>();
    for (const r of rows) {
      if (r.capability) capabilities.add(r.capability);
      for (const c of (r.role !== null && builtInRole(r.role)) || []) capabilities.add(c);
    }
    const scope = auditScopeOf(p, { capabilities }, filters);
    if (!scope) throw new ApiError(PROBLEMS.forbidden, `agent:${uid} holds no audit grant in org ${p.orgId}`);
    return scope;
  }
  const { grants } = await callerGrants(db, p.subject, p.orgId);
  const target = { kind: 'org' as const, org: p.orgId };
  const scope = auditScopeOf(
    p,
    {
      capabilities: new Set(grants.filter((g) => covers(g, target)).map((g) => g.capability)),
      platform: grants.some((g) => g.capability === 'platform:audit:read' && g.scope_kind === 'platform'),
    },
    filters,
  );
  if (!scope) throw new ApiError(PROBLEMS.forbidden, 'requires audit:read, audit:read:all or platform:audit:read');
  return scope;
}
