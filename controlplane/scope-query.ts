import type { FastifyRequest } from 'fastify';
import type { Target } from './authz/guard.ts';
import { targetResolver, type TargetResolver } from './authz/capability-hook.ts';
import { query } from '../core/schemas.ts';
import { bad } from './bad-request.ts';
import { ApiError, PROBLEMS } from './errors.ts';
import type { ChangeTarget } from './events.ts';
import type { Queryable } from '../core/sql.ts';
import { orgExists } from './store/orgs.ts';
import { groupExists } from './store/groups.ts';
import { getAgent } from './store/agents.ts';

// The scope a config value, a governance policy or a pack installation is authored at, from the
// query string (targets derive from the request line, never the body): `scope` (platform | org |
// group | agent; default platform), `org`, `group`, `agent`. Group and agent scopes require an org
// (spec rule 3): an agent's org and group come from the store.

export type ScopeKind = 'platform' | 'org' | 'group' | 'agent';
export interface Scope {
  kind: ScopeKind;
  org: string;
  group: string;
  agent: string;
  /** An agent scope whose agent is not there (or not in the org named): the 404 scopeMustExist answers. */
  missing?: string;
}

export const PLATFORM: Scope = { kind: 'platform', org: '', group: '', agent: '' };

export function scopeName(s: Scope): string {
  return s.kind === 'platform'
    ? 'platform'
    : s.kind === 'org'
      ? `org:${s.org}`
      : s.kind === 'group'
        ? `group:${s.org}:${s.group}`
        : `agent:${s.agent}`;
}

const resolved = new WeakMap<FastifyRequest, Promise<Scope>>();

/**
 * The scope of the query parameters; an agent is checked to exist (404). Resolved once per request:
 * the capability hook resolves it for the target (authz/capability-hook.ts), the handler reads it again.
 */
export function scopeOf(db: Queryable, req: FastifyRequest): Promise<Scope> {
  let s = resolved.get(req);
  if (!s) resolved.set(req, (s = parseScope(db, req)));
  return s;
}

/** The capability target of the request's scope; `first` checks the rest of the request line before. */
export function scopeTargetOf(db: Queryable, first?: (req: FastifyRequest) => void): TargetResolver {
  return targetResolver('query-scope', async (req) => {
    first?.(req);
    return scopeTarget(await scopeOf(db, req));
  });
}

/** The query parameters of a scoped route. */
export const SCOPE_QUERY = query(['scope', 'org', 'group', 'agent'], true);

async function parseScope(db: Queryable, req: FastifyRequest): Promise<Scope> {
  const q = req.query as Record<string, unknown>;
  for (const k of Object.keys(q))
    if (!['scope', 'org', 'group', 'agent'].includes(k)) bad(k, 'unknown query parameter (scope, org, group, agent)');
  const str = (k: string) => (typeof q[k] === 'string' ? (q[k] as string) : '');
  const kind = (str('scope') || 'platform') as ScopeKind;
  if (!['platform', 'org', 'group', 'agent'].includes(kind)) bad('scope', 'must be platform, org, group or agent');
  const s: Scope = { kind, org: str('org'), group: str('group'), agent: str('agent') };
  if (kind === 'platform') {
    if (s.org || s.group || s.agent) bad('scope', 'platform scope takes no org, group or agent');
    return s;
  }
  if (kind === 'agent') {
    if (!s.agent) bad('agent', 'is required at agent scope');
    const placed = await getAgent(db, s.agent);
    if (!placed || (s.org && s.org !== placed.org_id)) {
      // Checked over the org the caller named, or its own, and answered 404 only after that check
      // (scopeMustExist), as agentOrg does: a caller without the capability learns nothing of which
      // agents exist, nor in which org.
      const missing = s.org ? `no agent ${s.agent} in org ${s.org}` : `no agent ${s.agent}`;
      return { ...s, org: s.org || (req.principal?.orgId ?? ''), group: '', missing };
    }
    return { ...s, org: placed.org_id, group: placed.group_id };
  }
  if (!s.org) bad('org', `is required at ${kind} scope`);
  if (kind === 'group' && !s.group) bad('group', 'is required at group scope');
  return s;
}

/** 404 for an org, group or agent that does not exist (an agent's was found by scopeOf). */
export async function scopeMustExist(db: Queryable, s: Scope): Promise<void> {
  if (s.missing) throw new ApiError(PROBLEMS.notFound, s.missing);
  if (s.kind === 'platform' || s.kind === 'agent') return;
  if (!(await orgExists(db, s.org))) throw new ApiError(PROBLEMS.notFound, `no org ${s.org}`);
  if (s.kind === 'group' && !(await groupExists(db, s.org, s.group)))
    throw new ApiError(PROBLEMS.notFound, `no group ${s.group} in org ${s.org}`);
}

/** The capability target of a scope: an agent's scope is checked over its org. */
export function scopeTarget(s: Scope): Target {
  return s.kind === 'platform'
    ? { kind: 'platform' }
    : s.kind === 'group'
      ? { kind: 'group', org: s.org, group: s.group }
      : { kind: 'org', org: s.org };
}

/** The enclaves a change at this scope concerns. */
export function scopeChange(s: Scope): ChangeTarget {
  return s.kind === 'platform'
    ? { kind: 'platform' }
    : s.kind === 'agent'
      ? { kind: 'agent', agent: s.agent }
      : { kind: 'org', org: s.org };
}

/** The row coordinates of a scope: [scope_kind, org_id, group_id, agent_id] (agent rows carry no group). */
export function rowKey(s: Scope): [string, string, string, string] {
  return [
    s.kind,
    s.kind === 'platform' ? '' : s.org,
    s.kind === 'group' ? s.group : '',
    s.kind === 'agent' ? s.agent : '',
  ];
}

/** The scopes broader than `s` (for locks), most general first; with `self`, `s` too. */
export function broaderScopes(s: Scope, self: boolean): Scope[] {
  const order: Scope[] = [PLATFORM];
  if (s.kind !== 'platform') order.push({ kind: 'org', org: s.org, group: '', agent: '' });
  if ((s.kind === 'group' || s.kind === 'agent') && s.group)
    order.push({ kind: 'group', org: s.org, group: s.group, agent: '' });
  if (s.kind === 'agent') order.push(s);
  return self ? order : order.filter((o) => o.kind !== s.kind);
}
