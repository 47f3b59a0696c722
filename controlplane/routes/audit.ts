import { onGrantsChanged } from '../authz/capabilities.ts';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { newId } from '../../core/ids.ts';
import { gated } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import type { ReadRecord } from '../../audit-wal/read.ts';
import { auditParams, auditReadRoutes } from '../../audit-wal/read-routes.ts';
import type { AuditStore } from '../../audit-wal/store.ts';
import type { ChangeDeps } from '../audited-change.ts';
import { auditScope, type AuditScope } from '../authz/audit-scope.ts';
import { requireCapability } from '../authz/guard.ts';
import { arrayOf, INTEGER, pathParams, query, viewSchema, ANY } from '../../core/schemas.ts';
import { ApiError, OrgKeyShredded, PROBLEMS } from '../errors.ts';
import { getAgent } from '../store/agents.ts';
import type { ServiceAccountStatus } from '../auth/service-account-status.ts';
import type { StreamGuardDeps } from '../../core/stream-guard.ts';
import { isSealed, type OrgKeys } from '../crypto/org-keys.ts';

// The audit read API (operator-api.md: the audit routes, Audit rules 1–3, Events "Audit tail"),
// mounted when an audit store is configured (--audit-dsn):
//   GET /api/v1/audit/events   \  the routes both planes serve (audit-wal/read-routes.ts), authorized
//   GET /api/v1/audit/stream   /  here from the control plane's grants (authz/audit-scope.ts)
//   GET /api/v1/agents/{id}/audit-log   an agent's LLM audit entries, with findings
// The caller's scope is ANDed into every query and every poll. A platform operator's read of another
// org writes an audit record into that org's own view, before answering; attributes the control plane
// sealed under an org's key are opened for the reader.

export interface AuditReadOptions {
  pollMs: number;
  heartbeatMs: number;
  /** Re-checks the stream's authorization while it runs. */
  guard: StreamGuardDeps;
  /** A disabled service account's stream ends. */
  accountStatus: ServiceAccountStatus;
}

/** Audit attributes the control plane writes are sealed under the org's data key (crypto-shred). */
async function sealAttrs(
  keys: OrgKeys | null,
  org: string,
  attrs: Record<string, string>,
): Promise<Record<string, string>> {
  return keys && org ? { sealed: await keys.seal(org, JSON.stringify(attrs)) } : attrs;
}

/** Opens sealed attributes for the reader; after an erasure they read as empty. */
async function openAttrs(keys: OrgKeys | null, record: ReadRecord): Promise<ReadRecord> {
  const attrs = record.attrs as Record<string, string>;
  if (!keys || !isSealed(attrs?.sealed)) return record;
  try {
    return { ...record, attrs: JSON.parse(await keys.open(String(record.org_id), attrs.sealed)) };
  } catch (err) {
    if (err instanceof OrgKeyShredded) return { ...record, attrs: {} };
    throw err;
  }
}

const LLM_PAGE = viewSchema('llmAuditPage', {
  entries: arrayOf({ type: 'object', title: 'llmAuditEntry', additionalProperties: true }),
  next_offset: INTEGER,
});
const LOG_QUERY = query(['limit', 'offset'], false, ANY);

export function auditRoutes(deps: ChangeDeps, store: AuditStore, options: AuditReadOptions) {
  const { db } = deps;

  /** Rule 3: each other org a platform operator's read reached gets a record of the read. */
  const recordCrossOrg = async (req: FastifyRequest, scope: AuditScope, orgs: Iterable<string>) => {
    if (!scope.platform) return;
    const p = req.principal!;
    for (const org of new Set(orgs)) {
      if (!org || org === p.orgId) continue;
      const record = {
        id: newId(),
        event_time: new Date().toISOString(),
        kind: 'event',
        action: 'audit.read',
        actor: p.subject,
        actor_kind: p.kind,
        org_id: org,
        outcome: 'allow',
        resource: 'audit',
        scope: `org:${org}`,
        trace_id: String(req.id),
        attrs: await sealAttrs(deps.keys ?? null, org, { route: req.url.split('?')[0], reader_org: p.orgId || '' }),
      };
      try {
        await gated(deps.audit, 'audit_events', record, () => undefined, deps.capture);
      } catch (err) {
        if (err instanceof AuditUnavailableError) throw new ApiError(PROBLEMS.auditUnavailable, err.message);
        throw err;
      }
    }
  };

  // The audit scope is the authorization: auditScope (authz/audit-scope.ts) refuses a caller with no audit
  // grant and is the mandatory predicate of what the others read (spec: Audit rules 1).
  const scoped = (target: string, capability: 'audit:read' | 'audit:read:all') =>
    ({
      requiredCapability: capability,
      authorizedInHandler: "the caller's audit scope (authz/audit-scope.ts)",
      targetLabel: target,
      agentOperator: true,
    }) as const;

  const shared = auditReadRoutes({
    store,
    scopeOf: (req, filters) => auditScope(db, req, filters),
    onRead: recordCrossOrg,
    openRecord: (r) => openAttrs(deps.keys ?? null, r),
    wake: (recheck) => onGrantsChanged(db, recheck),
    streamRecheck: async (req) => {
      const p = req.principal!;
      return p.kind === 'service' && (await options.accountStatus.disabled(p.subject, true))
        ? 'account_disabled'
        : null;
    },
    pollMs: options.pollMs,
    heartbeatMs: options.heartbeatMs,
    guard: options.guard,
    config: {
      events: scoped('caller-org', 'audit:read'),
      stream: { ...scoped('caller-org', 'audit:read'), stream: true },
    },
  });

  return async (api: FastifyInstance) => {
    // On this same context, before the agent's audit log (the document lists them in this order).
    await shared(api);

    api.get(
      '/agents/:id/audit-log',
      {
        config: scoped('agent-org', 'audit:read:all'),
        schema: { params: pathParams('id'), querystring: LOG_QUERY, response: { 200: LLM_PAGE } },
      },
      async (req) => {
        const id = (req.params as { id: string }).id;
        const p = req.principal!;
        const { limit, offset } = auditParams(req);
        let org: string;
        if (p.kind === 'agent-operator') {
          // Its own trail only (spec: Agent operators, Reach), under its auditor grant.
          if (p.subject !== `agent:${id}`)
            throw new ApiError(PROBLEMS.forbidden, 'an agent-operator reads its own audit trail only');
          await auditScope(db, req, {});
          org = p.orgId;
        } else {
          org = (await getAgent(db, id))?.org_id ?? p.orgId;
          await requireCapability(db, req, 'audit:read:all', { kind: 'org', org });
        }
        const entries = await store.readLlm({ org, agentId: id, limit, offset });
        return { entries, next_offset: offset + entries.length };
      },
    );
  };
}
