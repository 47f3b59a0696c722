import { dict, own } from '../../../core/own.ts';
import type { Queryable } from '../../../core/sql.ts';

// Grants local to the enclave (broker_grants): a role or a capability held by a principal over an org.
// The broker authorizes its operator listener from these alone (never from the control plane's
// grants): --seed-admin's subjects get `admin` over the owning org at start; an admin grants the rest.
// Principals: `user:<subject>` (the local issuer's `sub`) or `group:<org>:<group>` (its groups claim).
// Roles: admin (everything), auditor (reads: the audit, the approvals), member (its own audit records),
// approver (the approvals: read and decide). Deciding a held tool call is granted on purpose, never by
// membership alone (docs/approvals.md).

export const BROKER_CAPABILITIES = [
  'audit:read',
  'audit:read:all',
  'secrets:manage',
  'members:*',
  'approvals:read',
  'approvals:decide',
] as const;
export type BrokerCapability = (typeof BROKER_CAPABILITIES)[number];

/** Looked up by names callers send, without a prototype (a role named `constructor` is just unknown). */
export const BROKER_ROLES: Readonly<Record<string, readonly BrokerCapability[]>> = Object.freeze(
  Object.assign(dict<readonly BrokerCapability[]>(), {
    admin: BROKER_CAPABILITIES,
    auditor: ['audit:read', 'audit:read:all', 'approvals:read'],
    member: ['audit:read'],
    approver: ['approvals:read', 'approvals:decide'],
  } satisfies Record<string, readonly BrokerCapability[]>),
);

export const brokerRole = (name: string): readonly BrokerCapability[] | undefined => own(BROKER_ROLES, name);
export const isBrokerCapability = (c: string): c is BrokerCapability =>
  (BROKER_CAPABILITIES as readonly string[]).includes(c);

export interface BrokerGrant {
  id: number;
  principal: string;
  role: string | null;
  capability: string | null;
  org_id: string;
}

const COLUMNS = 'id, principal, role, capability, org_id';
const row = (r: BrokerGrant): BrokerGrant => ({ ...r, id: Number(r.id) });

// Who is told when the enclave's grants change: open audit streams re-check their caller at once
// (core/stream-guard.ts). insertGrant and deleteGrant run inside their caller's transaction, so the caller
// announces the change once it committed (grantsChanged): a re-check before the commit would still find
// the grant. A change made elsewhere (a row edited by hand) is seen by the streams' periodic re-check.
const listeners = new WeakMap<object, Set<() => void>>();

/** Calls `fn` after every grant change committed through this process on `db`; returns the unsubscribe. */
export function onGrantsChanged(db: object, fn: () => void): () => void {
  let set = listeners.get(db);
  if (!set) listeners.set(db, (set = new Set()));
  set.add(fn);
  return () => set.delete(fn);
}

/** Announces a committed grant change on `db` to this process's listeners. */
export function grantsChanged(db: object): void {
  for (const fn of listeners.get(db) ?? []) fn();
}

export async function listGrants(db: Queryable, org: string): Promise<BrokerGrant[]> {
  return (
    await db.query<BrokerGrant>(`SELECT ${COLUMNS} FROM broker_grants WHERE org_id = $1 ORDER BY id`, [org])
  ).rows.map(row);
}

/** Inserts a grant; null when the same grant exists. */
export async function insertGrant(
  db: Queryable,
  g: { principal: string; role: string | null; capability: string | null; org: string },
): Promise<BrokerGrant | null> {
  const { rows } = await db.query<BrokerGrant>(
    `INSERT INTO broker_grants (principal, role, capability, org_id) VALUES ($1, $2, $3, $4)
     ON CONFLICT DO NOTHING RETURNING ${COLUMNS}`,
    [g.principal, g.role, g.capability, g.org],
  );
  return rows[0] ? row(rows[0]) : null;
}

export async function deleteGrant(db: Queryable, org: string, id: number): Promise<BrokerGrant | null> {
  const { rows } = await db.query<BrokerGrant>(
    `DELETE FROM broker_grants WHERE org_id = $1 AND id = $2 RETURNING ${COLUMNS}`,
    [org, id],
  );
  return rows[0] ? row(rows[0]) : null;
}

export async function seedAdmin(db: Queryable, subject: string, org: string): Promise<void> {
  if (await insertGrant(db, { principal: `user:${subject}`, role: 'admin', capability: null, org })) grantsChanged(db);
}

/** The principals a caller acts as: its subject, and each of its groups in its org. */
export function principalsOf(p: { subject: string; orgId: string; claims: Record<string, unknown> }): string[] {
  const groups = Array.isArray(p.claims.groups) ? p.claims.groups.filter((g) => typeof g === 'string') : [];
  return [`user:${p.subject}`, ...groups.map((g) => `group:${p.orgId}:${g}`)];
}

/** The capabilities a caller holds over its own org (roles expanded). */
export async function capabilitiesOf(
  db: Queryable,
  p: { subject: string; orgId: string; claims: Record<string, unknown> },
): Promise<Set<BrokerCapability>> {
  const held = new Set<BrokerCapability>();
  if (!p.orgId) return held;
  const { rows } = await db.query<{ role: string | null; capability: string | null }>(
    'SELECT role, capability FROM broker_grants WHERE org_id = $1 AND principal = ANY($2)',
    [p.orgId, principalsOf(p)],
  );
  for (const r of rows) {
    if (r.capability && isBrokerCapability(r.capability)) held.add(r.capability);
    for (const c of (r.role && brokerRole(r.role)) || []) held.add(c);
  }
  return held;
}
