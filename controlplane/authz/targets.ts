import type { FastifyRequest } from 'fastify';
import type { Queryable } from '../../core/sql.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import { getAgent, type AgentRow } from '../store/agents.ts';
import { checkedTarget, targetResolver } from './capability-hook.ts';

// The capability targets routes declare (spec: Authentication, rule 4: from the route path, never the
// body). Targets that need the store (an agent's org, an enclave's owner) are declared beside their routes.

export const PLATFORM = targetResolver('platform', () => ({ kind: 'platform' }));

/** The org in the path (`/orgs/{org}/…`). */
export const PATH_ORG = targetResolver('path-org', (req: FastifyRequest) => ({
  kind: 'org',
  org: (req.params as { org: string }).org,
}));

/** The org the caller's token names; a token naming none is a 400 (org-scope rows are the caller's org's). */
export function tokenOrg(req: FastifyRequest): string {
  const org = req.principal?.orgId;
  if (!org)
    throw new ApiError(PROBLEMS.badRequest, "the token names no org: org-scope policy is written for the caller's org");
  return org;
}

/** The caller's org, which its token must name (tokenOrg). */
export const TOKEN_ORG = targetResolver('caller-org', (req: FastifyRequest) => ({ kind: 'org', org: tokenOrg(req) }));

/** The caller's own org (the token's org claim). */
export const CALLER_ORG = targetResolver('caller-org', (req: FastifyRequest) => ({
  kind: 'org',
  org: req.principal?.orgId ?? '',
}));

/**
 * The org of the agent `{id}` names; for an agent that does not exist, the caller's own org, so a caller
 * without the capability there learns nothing of which agents exist (the handler answers 404 to the rest).
 */
export function agentOrg(db: Queryable) {
  return targetResolver('agent-org', async (req: FastifyRequest) => {
    const { rows } = await db.query<{ org_id: string }>('SELECT org_id FROM agents WHERE uid = $1', [
      (req.params as { id: string }).id,
    ]);
    return { kind: 'org', org: rows[0]?.org_id ?? req.principal?.orgId ?? '' };
  });
}

/**
 * The agent `{id}` of a route checked over agentOrg, loaded for the handler: 404 when there is none, and
 * when it is no longer in the org the capability was checked over (deleted and made anew elsewhere
 * between the check and this load).
 */
export async function checkedAgent(db: Queryable, req: FastifyRequest, id: string): Promise<AgentRow> {
  const agent = await getAgent(db, id);
  const target = checkedTarget(req);
  if (!agent || target?.kind !== 'org' || target.org !== agent.org_id) {
    throw new ApiError(PROBLEMS.notFound, `no agent ${id}`);
  }
  return agent;
}
