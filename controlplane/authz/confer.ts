import type { FastifyRequest } from 'fastify';
import type { Queryable } from '../../core/sql.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import {
  builtInRole,
  CAPABILITIES,
  effectiveCapabilities,
  groupsOf,
  type Capability,
  type ScopeKind,
} from './capabilities.ts';
import { describe, holds, type Target } from './guard.ts';

// A caller may confer only what it holds (docs/decisions.md, "A caller confers only what it holds"): a grant, a role's
// definition, a group membership that carries the group's grants and a service account's grant pass on capabilities,
// and each of them is refused (403 naming the capability and the scope) unless the caller holds every capability
// conferred over the scope it is conferred at. The rule self-service service accounts always followed, applied
// to every route that confers. Without it an org admin could grant itself platform:config at its org
// and write governance policy it was never given.

/** The capabilities a grant of `role` or `capability` confers (a custom role read from the store). */
export async function conferredBy(
  db: Queryable,
  role: string | null,
  capability: string | null,
): Promise<Capability[]> {
  if (capability !== null)
    return (CAPABILITIES as readonly string[]).includes(capability) ? [capability as Capability] : [];
  if (role === null) return [];
  const builtIn = builtInRole(role);
  if (builtIn) return [...builtIn];
  const { rows } = await db.query<{ capabilities: string[] }>('SELECT capabilities FROM roles WHERE name = $1', [role]);
  return (rows[0]?.capabilities ?? []).filter((c): c is Capability => (CAPABILITIES as readonly string[]).includes(c));
}

/** The scope a stored grant row is held at, as a capability target. */
export function grantScope(g: { scope_kind: ScopeKind; org_id: string; group_id: string; agent_id: string }): Target {
  switch (g.scope_kind) {
    case 'platform':
      return { kind: 'platform' };
    case 'org':
      return { kind: 'org', org: g.org_id };
    case 'group':
      return { kind: 'group', org: g.org_id, group: g.group_id };
    case 'agent':
      return { kind: 'agent', org: g.org_id, agent: g.agent_id };
  }
}

/** 403 unless the caller holds every one of `capabilities` over `target`; `what` says what confers them. */
export async function requireConferrable(
  db: Queryable,
  req: FastifyRequest,
  capabilities: readonly Capability[],
  target: Target,
  what: string,
): Promise<void> {
  for (const capability of capabilities) {
    if (!(await holds(db, req, capability, target))) {
      throw new ApiError(
        PROBLEMS.forbidden,
        `${what} confers ${capability} over ${describe(target)}, which you do not hold: a caller may confer only capabilities it holds`,
      );
    }
  }
}

/**
 * 403 unless the caller holds everything the service account `id` of `org` holds: a new key for an
 * account, or its ownership, hands over the power to act as it, and so everything it was granted.
 */
export async function requireHoldsAllOf(
  db: Queryable,
  req: FastifyRequest,
  id: string,
  org: string,
  what: string,
): Promise<void> {
  const held = await effectiveCapabilities(db, { subject: id, orgId: org, groups: await groupsOf(db, org, id) });
  for (const g of held) await requireConferrable(db, req, [g.capability], grantScope(g), what);
}
