import { dict, own } from '../../core/own.ts';
import type { Queryable } from '../../core/sql.ts';

// Capabilities (spec: "Capabilities named") and built-in roles. One function computes a principal's
// effective capabilities; `whoami` shows its result and every capability-gated route asks it.

export const CAPABILITIES = [
  'platform:config',
  'enclaves:read',
  'agents:manage',
  'org:manage',
  'members:*',
  'clients:manage',
  'audit:read',
  'audit:read:all',
  'platform:audit:read',
] as const;
export type Capability = (typeof CAPABILITIES)[number];

export type ScopeKind = 'platform' | 'org' | 'group' | 'agent';

/**
 * Looked up by names callers send (a grant's role, a role path): without a prototype, and read through
 * `builtInRole`, so `constructor` or `__proto__` is a role name like any other, never a member of
 * Object.prototype (a 500 once, for a grant of role `constructor`).
 */
export const BUILT_IN_ROLES: Readonly<Record<string, readonly Capability[]>> = Object.freeze(
  Object.assign(dict<readonly Capability[]>(), {
    'platform-admin': CAPABILITIES,
    'org-admin': [
      'org:manage',
      'members:*',
      'agents:manage',
      'clients:manage',
      'enclaves:read',
      'audit:read',
      'audit:read:all',
    ],
    member: ['enclaves:read'],
    auditor: ['audit:read', 'audit:read:all'],
  } satisfies Record<string, readonly Capability[]>),
);

/** The capabilities of the built-in role `name`; undefined when it is not one. */
export function builtInRole(name: string): readonly Capability[] | undefined {
  return own(BUILT_IN_ROLES, name);
}

export interface EffectiveGrant {
  capability: Capability;
  scope_kind: ScopeKind;
  org_id: string;
  group_id: string;
  agent_id: string;
}

export interface PrincipalRef {
  subject: string;
  orgId: string;
  groups: string[];
}

/** The principal strings a caller acts as: itself and each of its groups in its org. */
export function principalsOf(p: PrincipalRef): string[] {
  return [`user:${p.subject}`, ...p.groups.map((g) => `group:${p.orgId}:${g}`)];
}

export async function groupsOf(db: Queryable, orgId: string, subject: string): Promise<string[]> {
  if (!orgId) return [];
  const { rows } = await db.query<{ group_id: string }>(
    'SELECT group_id FROM memberships WHERE org_id = $1 AND subject = $2 ORDER BY group_id',
    [orgId, subject],
  );
  return rows.map((r) => r.group_id);
}

/** Every capability the principal holds, with the scope it holds it at (roles expanded). */
export async function effectiveCapabilities(db: Queryable, p: PrincipalRef): Promise<EffectiveGrant[]> {
  const { rows } = await db.query<{
    scope_kind: ScopeKind;
    org_id: string;
    group_id: string;
    agent_id: string;
    role: string | null;
    capability: string | null;
    custom: string[] | null;
  }>(
    `SELECT g.scope_kind, g.org_id, g.group_id, g.agent_id, g.role, g.capability, r.capabilities AS custom
       FROM grants g LEFT JOIN roles r ON r.name = g.role
      WHERE g.principal = ANY($1)`,
    [principalsOf(p)],
  );
  const out: EffectiveGrant[] = [];
  const seen = new Set<string>();
  for (const row of rows) {
    const caps = row.capability
      ? [row.capability]
      : ((row.role === null ? undefined : builtInRole(row.role)) ?? row.custom ?? []);
    for (const capability of caps) {
      if (!(CAPABILITIES as readonly string[]).includes(capability)) continue;
      const key = [capability, row.scope_kind, row.org_id, row.group_id, row.agent_id].join('\u0000');
      if (seen.has(key)) continue;
      seen.add(key);
      out.push({
        capability: capability as Capability,
        scope_kind: row.scope_kind,
        org_id: row.org_id,
        group_id: row.group_id,
        agent_id: row.agent_id,
      });
    }
  }
  return out;
}

// The grants of a caller, cached per store: every request of an authenticated caller needs them, and
// they change only through the operator API. Any change committed through this process bumps the
// store's generation and so drops every entry at once (auditedChange calls `grantsChanged`); a change
// committed by another replica does the same here when its NOTIFY on AUTHZ_CHANNEL arrives (events.ts
// LISTENs, server.ts calls `grantsChanged`), and at worst (a row edited by hand, the LISTEN connection
// down) is seen within CACHE_TTL_MS.
const CACHE_TTL_MS = 5_000;
const CACHE_MAX = 10_000;
interface CacheState {
  generation: number;
  entries: Map<string, { generation: number; until: number; groups: string[]; grants: EffectiveGrant[] }>;
}
const caches = new WeakMap<object, CacheState>();

// Who is told after the cache is dropped: open streams re-check their authorization (core/stream-guard.ts).
const changeListeners = new WeakMap<object, Set<() => void>>();

/** The PostgreSQL channel every committed change is announced on, to every replica. */
export const AUTHZ_CHANNEL = 'dvx_authz_changes';

/**
 * Announces a change inside its own transaction: PostgreSQL delivers the NOTIFY to every replica
 * LISTENing when, and only if, the transaction commits (PGlite: this process only).
 */
export async function announceGrantsChanged(tx: Queryable): Promise<void> {
  await tx.query(`SELECT pg_notify('${AUTHZ_CHANNEL}', '')`);
}

export function grantsChanged(db: object): void {
  const state = caches.get(db);
  if (state) {
    state.generation++;
    state.entries.clear();
  }
  for (const fn of changeListeners.get(db) ?? []) fn();
}

/**
 * Calls `fn` after every change committed through this process on `db` (auditedChange, erasure); returns the
 * unsubscribe.
 */
export function onGrantsChanged(db: object, fn: () => void): () => void {
  let set = changeListeners.get(db);
  if (!set) changeListeners.set(db, (set = new Set()));
  set.add(fn);
  return () => set.delete(fn);
}

/** The caller's groups in its org and its effective grants (roles expanded), cached per store. */
export async function callerGrants(
  db: Queryable,
  subject: string,
  orgId: string,
): Promise<{ groups: string[]; grants: EffectiveGrant[] }> {
  let state = caches.get(db);
  if (!state) caches.set(db, (state = { generation: 0, entries: new Map() }));
  const key = `${subject}\u0000${orgId}`;
  const hit = state.entries.get(key);
  if (hit && hit.generation === state.generation && hit.until > Date.now()) return hit;
  const generation = state.generation;
  const groups = await groupsOf(db, orgId, subject);
  const grants = await effectiveCapabilities(db, { subject, orgId, groups });
  if (generation === state.generation) {
    if (state.entries.size >= CACHE_MAX) state.entries.clear();
    state.entries.set(key, { generation, until: Date.now() + CACHE_TTL_MS, groups, grants });
  }
  return { groups, grants };
}
