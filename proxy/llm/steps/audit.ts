import { performance } from 'node:perf_hooks';
import { gated } from '../../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../../audit-wal/errors.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';

// The call's audit record (llm_audit_log): written once, before the answer's last byte leaves, so a
// process killed after answering has its record (durable in the WAL, with capture-or-deny; in the
// kernel's pipe or file on stdout). Only a call with an identity whose org audits has one.

/**
 * Runs `send` (the answer leaving for the agent) once the call's audit record is appended (durable,
 * with a durable sink); false when capture-or-deny refused it.
 */
export async function deliver(ctx: CallContext, send: () => void): Promise<boolean> {
  const d = ctx.d;
  // A call a reload cut (LlmProxy.recheck) while its answer was being made delivers nothing.
  if (ctx.cut !== null) throw new Refusal(ERRORS.agentRefused, ctx.cut);
  if (!ctx.audit || !ctx.identity) {
    send();
    return true;
  }
  ctx.audited = true;
  // A cut that lands while the record is made durable (capture-or-deny waits for it) is seen here,
  // before anything leaves.
  const effect = () => {
    if (ctx.cut !== null) throw new Refusal(ERRORS.agentRefused, ctx.cut);
    send();
  };
  try {
    await gated(d.audit, 'llm_audit_log', record(ctx), effect, { ...d.capture, log: d.log });
    return true;
  } catch (err) {
    if (err instanceof Refusal && ctx.cut !== null) {
      // The record written says allow and may be durable already: the cut is a record of its own,
      // under a derived id, so neither hides the other (as the capture refusal below).
      ctx.decision = 'deny';
      ctx.error = ctx.cut;
      ctx.status = ERRORS.agentRefused.status;
      d.audit.append('llm_audit_log', { ...record(ctx), id: `${ctx.id}.cut` }).catch((e: Error) => {
        d.log.error({ err: e, request_id: ctx.id }, 'audit record of the cut lost');
      });
      throw err;
    }
    if (!(err instanceof AuditUnavailableError)) throw err;
    // The record went to the sink and may still land; the refusal is a record of its own, under a
    // derived id, so neither hides the other (a store keeps the first row of an id).
    ctx.error = err.message;
    ctx.status = ERRORS.auditUnavailable.status;
    d.audit.append('llm_audit_log', { ...record(ctx), id: `${ctx.id}.refused` }).catch((e: Error) => {
      d.log.error({ err: e, request_id: ctx.id }, 'audit record of the refusal lost');
    });
    return false;
  }
}

/** Appends the call's record once (refusals are not gated: capture-or-deny governs effects). */
export function appendRecord(ctx: CallContext): void {
  if (!ctx.identity || !ctx.audit || ctx.audited) return;
  ctx.audited = true;
  ctx.d.audit.append('llm_audit_log', record(ctx)).catch((err: Error) => {
    ctx.d.log.error({ err, request_id: ctx.id }, 'audit record lost');
  });
}

function record(ctx: CallContext): Record<string, unknown> {
  const totalMs = performance.now() - ctx.started;
  const identity = ctx.identity!;
  return {
    id: ctx.id,
    event_time: new Date().toISOString(),
    org_id: identity.orgId,
    agent_id: identity.agentId,
    agent_name: identity.agentName,
    enclave_id: ctx.d.options.enclaveId || ctx.snapshot.enclave.id,
    format: ctx.format,
    upstream_format: ctx.translatedTo,
    path: ctx.path,
    model: ctx.model,
    status: ctx.status,
    upstream_status: ctx.upstreamStatus,
    latency_ms: round(totalMs),
    upstream_latency_ms: ctx.upstreamMs === null ? null : round(ctx.upstreamMs),
    overhead_ms: round(Math.max(0, totalMs - (ctx.upstreamMs ?? 0))),
    request_bytes: ctx.requestBytes,
    response_bytes: ctx.responseBytes,
    input_tokens: ctx.usage?.input_tokens ?? null,
    output_tokens: ctx.usage?.output_tokens ?? null,
    decision: ctx.decision,
    findings: ctx.findings,
    inspection_failopen: ctx.failOpen,
    inspection_failures: ctx.failures,
    error: ctx.error,
  };
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
