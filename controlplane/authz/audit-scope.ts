import type { FastifyRequest } from 'fastify';
import type { Queryable } from '../../core/sql.ts';
import type { AuditFilters, AuditPredicate } from '../../audit-wal/query.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { builtInRole } from './capabilities.ts';
import { callerGrants } from './capabilities.ts';
import { covers } from './guard.ts';

// The one place the caller's audit scope is decided (operator-api.md: Audit read personas, Agent
// operators "Reach"). The result is ANDed into every query and every stream poll on either store.
//
//   platform:audit:read (platform)   every org's control-plane events (kind "event"); `org` narrows;
//                                    never an enclave's records (network flows)
//   audit:read:all over own org      own org, every actor
//   audit:read over own org          own org, own actor only (no other principal, nothing unattributed)
//   agent-operator                   own org, records attributed to agent:<uid> (needs the auditor grant
//                                    to principal agent:<uid>, org-scoped)
//   anything else                    403

export interface AuditScope {
  predicate: AuditPredicate;
  filters: AuditFilters;
  /** A platform operator's read: its reads of other orgs are themselves recorded. */
  platform: boolean;
}

export async function auditScope(db: Queryable, req: FastifyRequest, filters: AuditFilters): Promise<AuditScope> {
  const p = req.principal;
  if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
  const own = { ...filters };
  delete own.org; // honoured only for a platform operator
  if (p.kind === 'agent-operator') {
    const uid = p.subject.replace(/^agent:/, '');
    const { rows } = await db.query<{ role: string | null; capability: string | null }>(
      `SELECT role, capability FROM grants WHERE principal = $1 AND scope_kind = 'org' AND org_id = $2`,
      [`agent:${uid}`, p.orgId],
    );
    const held = rows.some(
      (r) => r.capability === 'audit:read' || (r.role !== null && builtInRole(r.role)?.includes('audit:read') === true),
    );
    if (!held) throw new ApiError(PROBLEMS.forbidden, `agent:${uid} holds no audit grant in org ${p.orgId}`);
    return { predicate: { orgs: [p.orgId], agent: uid }, filters: own, platform: false };
  }
  const { grants } = await callerGrants(db, p.subject, p.orgId);
  if (grants.some((g) => g.capability === 'platform:audit:read' && g.scope_kind === 'platform')) {
    return { predicate: { orgs: 'all', kinds: ['event'] }, filters, platform: true };
  }
  const target = { kind: 'org' as const, org: p.orgId };
  if (p.orgId && grants.some((g) => g.capability === 'audit:read:all' && covers(g, target))) {
    return { predicate: { orgs: [p.orgId] }, filters: own, platform: false };
  }
  if (p.orgId && grants.some((g) => g.capability === 'audit:read' && covers(g, target))) {
    return { predicate: { orgs: [p.orgId], actor: p.subject }, filters: own, platform: false };
  }
  throw new ApiError(PROBLEMS.forbidden, 'requires audit:read, audit:read:all or platform:audit:read');
}
