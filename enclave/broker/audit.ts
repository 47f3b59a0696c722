import { newId } from '../../core/ids.ts';
import type { Queryable } from '../../core/sql.ts';
import { gated } from '../../audit-wal/gate.ts';
import type { BrokerDeps } from './deps.ts';

// The broker's own audit (capture-or-deny): every lifecycle change, secret write and refused exchange
// is an `audit_events` record in the enclave's audit store. A change runs in a transaction and commits
// only once its record is durable; past --audit-capture-timeout it rolls back and the caller is refused
// (AuditUnavailableError, answered 503).

/** Who did it: an operator (`user:…` subjects as the local issuer names them), an agent, or the broker. */
export interface BrokerActor {
  subject: string;
  kind: string;
  traceId?: string;
}

export const BROKER_ACTOR = (enclaveId: string): BrokerActor => ({ subject: `enclave:${enclaveId}`, kind: 'service' });

export interface AuditedOutcome<T> {
  result: T;
  resource: string;
  outcome?: 'allow' | 'deny';
  reason?: string;
  /** Extra detail (never a secret value, token or key). */
  attrs?: Record<string, string>;
}

function record(
  deps: BrokerDeps,
  actor: BrokerActor,
  action: string,
  orgId: string,
  o: Omit<AuditedOutcome<unknown>, 'result'>,
) {
  return {
    id: newId(),
    event_time: new Date(deps.now()).toISOString(),
    kind: 'event',
    action,
    actor: actor.subject,
    actor_kind: actor.kind,
    org_id: orgId,
    outcome: o.outcome ?? 'allow',
    resource: o.resource,
    scope: orgId ? `org:${orgId}` : 'enclave',
    source: 'broker',
    enclave_id: deps.enclave.id,
    enclave_name: deps.enclave.name,
    trace_id: actor.traceId ?? newId(),
    ...(o.reason === undefined ? {} : { reason: o.reason }),
    ...(o.attrs === undefined ? {} : { attrs: o.attrs }),
  };
}

/** Runs `change` in a transaction that commits only once its audit record is durable. */
export async function auditedChange<T>(
  deps: BrokerDeps,
  actor: BrokerActor,
  action: string,
  orgId: string,
  change: (tx: Queryable) => Promise<AuditedOutcome<T>>,
): Promise<T> {
  return deps.db.transaction(async (tx) => {
    const out = await change(tx);
    await gated(deps.audit, 'audit_events', record(deps, actor, action, orgId, out), () => undefined, deps.capture);
    return out.result;
  });
}

/**
 * Records a refusal (outcome deny). The refusal stands whatever happens to its record: a record that
 * cannot be made durable is logged, and the caller is refused all the same.
 */
export async function auditRefusal(
  deps: BrokerDeps,
  actor: BrokerActor,
  action: string,
  orgId: string,
  resource: string,
  reason: string,
): Promise<void> {
  await gated(
    deps.audit,
    'audit_events',
    record(deps, actor, action, orgId, { resource, outcome: 'deny', reason }),
    () => undefined,
    deps.capture,
  ).catch((err: unknown) => deps.log.error({ err, action, resource }, 'refusal not recorded'));
}
