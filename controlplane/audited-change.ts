import type { FastifyRequest } from 'fastify';
import { newId } from '../core/ids.ts';
import { gated, type CaptureOptions } from '../audit-wal/gate.ts';
import { AuditUnavailableError } from '../audit-wal/errors.ts';
import type { AuditSink } from '../audit-wal/sink.ts';
import { ApiError, PROBLEMS } from './errors.ts';
import { announceGrantsChanged, grantsChanged } from './authz/capabilities.ts';
import type { OrgKeys } from './crypto/org-keys.ts';
import type { Db, Queryable } from '../core/sql.ts';
import type { Logger } from '../core/logger.ts';
import type { ControlPlaneMetrics } from './metrics.ts';

// Every change of the operator API goes through here (spec: operator-api rule 4 and "Audit durability
// flags"): the change runs in a transaction, its audit_events record is made durable before the
// commit, and if it cannot be in time the transaction rolls back and the caller gets 503.

export interface ChangeDeps {
  db: Db;
  audit: AuditSink;
  capture: Omit<CaptureOptions, 'log'>;
  /** Per-org data keys sealing sensitive columns; null without a KMS (stored unsealed). */
  keys?: OrgKeys | null;
  log: Logger;
  metrics: ControlPlaneMetrics;
}

/**
 * Who a change is attributed to: a request's principal, or the control plane itself for work it does on its own (at
 * start).
 */
export interface ChangeActor {
  subject: string;
  kind: string;
  traceId: string;
}

export const CONTROL_PLANE_ACTOR = (): ChangeActor => ({ subject: 'controlplane', kind: 'service', traceId: newId() });

export async function auditedChange<T>(
  deps: ChangeDeps,
  req: FastifyRequest,
  action: string,
  orgId: string,
  change: (tx: Queryable) => Promise<{ result: T; resource: string }>,
): Promise<T> {
  const p = req.principal!;
  return auditedChangeBy(deps, { subject: p.subject, kind: p.kind, traceId: String(req.id) }, action, orgId, change);
}

/** `auditedChange` for an actor named outright; `outcome`/`reason` record a failure the change stores. */
export async function auditedChangeBy<T>(
  deps: ChangeDeps,
  actor: ChangeActor,
  action: string,
  orgId: string,
  change: (tx: Queryable) => Promise<{ result: T; resource: string; outcome?: 'allow' | 'deny'; reason?: string }>,
): Promise<T> {
  try {
    const out = await deps.db.transaction(async (tx) => {
      const { result, resource, outcome, reason } = await change(tx);
      const record = {
        id: newId(),
        event_time: new Date().toISOString(),
        kind: 'event',
        action,
        actor: actor.subject,
        actor_kind: actor.kind,
        org_id: orgId,
        outcome: outcome ?? 'allow',
        resource,
        scope: orgId ? `org:${orgId}` : 'platform',
        trace_id: actor.traceId,
        ...(reason === undefined ? {} : { reason }),
      };
      await gated(deps.audit, 'audit_events', record, () => undefined, deps.capture);
      // Other replicas drop their grant caches and re-check their open streams when this commits.
      await announceGrantsChanged(tx);
      return result;
    });
    grantsChanged(deps.db);
    return out;
  } catch (err) {
    if (err instanceof AuditUnavailableError) throw new ApiError(PROBLEMS.auditUnavailable, err.message);
    if ((err as { code?: string }).code === '23505')
      throw new ApiError(PROBLEMS.conflict, 'an identical resource exists');
    throw err;
  }
}
