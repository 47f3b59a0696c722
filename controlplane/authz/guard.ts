import type { FastifyRequest } from 'fastify';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { Queryable } from '../../core/sql.ts';
import { callerGrants, type Capability, type EffectiveGrant } from './capabilities.ts';

// The capability check every gated route runs (spec: Authentication, rules 3–4): the target comes from
// the route path, never the body; the agent-operator kind is refused before any grant is loaded.

export type Target =
  | { kind: 'platform' }
  | { kind: 'org'; org: string }
  | { kind: 'group'; org: string; group: string }
  | { kind: 'agent'; org: string; agent: string };

/**
 * A grant covers a target when it is platform-wide, held over the target's org, or held over exactly
 * the group or agent the target names. A group or agent grant never covers its whole org.
 */
export function covers(grant: EffectiveGrant, target: Target): boolean {
  if (grant.scope_kind === 'platform') return true;
  if (target.kind === 'platform' || grant.org_id !== target.org) return false;
  if (grant.scope_kind === 'org') return true;
  if (grant.scope_kind === 'group') return target.kind === 'group' && grant.group_id === target.group;
  return target.kind === 'agent' && grant.agent_id === target.agent;
}

export function describe(target: Target): string {
  switch (target.kind) {
    case 'platform':
      return 'the platform';
    case 'org':
      return `org ${target.org}`;
    case 'group':
      return `group ${target.group} of org ${target.org}`;
    case 'agent':
      return `agent ${target.agent} of org ${target.org}`;
  }
}

/** Whether the caller holds `capability` over `target` (false for the agent-operator kind). */
export async function holds(
  db: Queryable,
  req: FastifyRequest,
  capability: Capability,
  target: Target,
): Promise<boolean> {
  const p = req.principal;
  if (!p || p.kind === 'agent-operator') return false;
  const { grants } = await callerGrants(db, p.subject, p.orgId);
  return grants.some((g) => g.capability === capability && covers(g, target));
}

export async function requireCapability(
  db: Queryable,
  req: FastifyRequest,
  capability: Capability,
  target: Target,
): Promise<void> {
  const p = req.principal;
  if (!p) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
  if (p.kind === 'agent-operator') throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
  if (!(await holds(db, req, capability, target)))
    throw new ApiError(PROBLEMS.forbidden, `requires ${capability} over ${describe(target)}`);
}
