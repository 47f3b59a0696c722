import type { FastifyRequest } from 'fastify';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { Queryable } from '../store/db.ts';
import { effectiveCapabilities, groupsOf, type Capability, type EffectiveGrant } from './capabilities.ts';

// The capability check every gated route runs (spec: Authentication, rules 3–4): the target comes from
// the route path, never the body; the agent-operator kind is refused before any grant is loaded.

export type Target = { kind: 'platform' } | { kind: 'org'; org: string };

/** A grant covers a target when it is platform-wide, or held over that org. */
export function covers(grant: EffectiveGrant, target: Target): boolean {
  if (grant.scope_kind === 'platform') return true;
  return target.kind === 'org' && grant.scope_kind === 'org' && grant.org_id === target.org;
}

export async function requireCapability(db: Queryable, req: FastifyRequest, capability: Capability, target: Target): Promise<void> {
  const p = req.principal;
  if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
  if (p.kind === 'agent-operator') throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
  const grants = await effectiveCapabilities(db, { subject: p.subject, orgId: p.orgId, groups: await groupsOf(db, p.orgId, p.subject) });
  if (!grants.some((g) => g.capability === capability && covers(g, target))) {
    throw new ApiError(PROBLEMS.forbidden, `requires ${capability} over ${target.kind === 'platform' ? 'the platform' : `org ${target.org}`}`);
  }
}
