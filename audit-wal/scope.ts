import type { AuditFilters, AuditPredicate } from './query.ts';

// The audit read personas (operator-api.md: Audit read personas, Agent operators "Reach"), the one rule
// both planes apply: which capability a caller holds over its org decides the predicate ANDed into every
// query and every stream poll on either store. Where the capabilities come from is each plane's own
// (the control plane's grants, the enclave broker's local grants); this rule never looks them up.
//
//   platform:audit:read (platform)   every org's control-plane events (kind "event"); `org` narrows;
//                                    never an enclave's records (network flows). The broker never
//                                    passes it: there is no cross-enclave aggregation.
//   audit:read:all over own org      own org, every actor
//   audit:read over own org          own org, own actor only (no other principal, nothing unattributed)
//   agent-operator                   own org, records attributed to agent:<uid>; it needs audit:read held
//                                    by the principal agent:<uid> (the auditor grant, org-scoped)
//   anything else                    no scope: the caller is refused (403)

export interface AuditScope {
  predicate: AuditPredicate;
  filters: AuditFilters;
  /** A platform operator's read: its reads of other orgs are themselves recorded. */
  platform: boolean;
}

/** Who reads: the authenticated principal's kind, subject and org. */
export interface AuditCaller {
  kind: string;
  subject: string;
  orgId: string;
}

/** What the caller holds, as its plane looked it up. */
export interface AuditHeld {
  /**
   * The capabilities held over the caller's own org (roles expanded); for an agent-operator, those the
   * principal agent:<uid> holds there.
   */
  capabilities: ReadonlySet<string>;
  /** platform:audit:read at platform scope (the control plane only). */
  platform?: boolean;
}

/** The caller's audit scope, or null when it holds no audit grant (the plane answers 403). */
export function auditScopeOf(caller: AuditCaller, held: AuditHeld, filters: AuditFilters): AuditScope | null {
  const own = { ...filters };
  delete own.org; // honoured only for a platform operator
  if (caller.kind === 'agent-operator') {
    if (!held.capabilities.has('audit:read')) return null;
    const uid = caller.subject.replace(/^agent:/, '');
    return { predicate: { orgs: [caller.orgId], agent: uid }, filters: own, platform: false };
  }
  if (held.platform) return { predicate: { orgs: 'all', kinds: ['event'] }, filters, platform: true };
  if (!caller.orgId) return null;
  if (held.capabilities.has('audit:read:all'))
    return { predicate: { orgs: [caller.orgId] }, filters: own, platform: false };
  if (held.capabilities.has('audit:read'))
    return { predicate: { orgs: [caller.orgId], actor: caller.subject }, filters: own, platform: false };
  return null;
}
