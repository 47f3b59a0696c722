import { performance } from 'node:perf_hooks';
import type { Flow, GatewayDeps } from './context.ts';

// A flow's `network_flow` record (docs/gateway.md, "The network_flow record"): appended once, when the
// flow ends (a refusal at once), to the audit sink's `network_flow` table, which a store keeps as
// `audit_events` rows of kind `network_flow` (audit-wal/rows.ts) where the audit read API's `proto` and
// `dst_host` filters find them. The record's time is when it is appended (its end), so that the audit
// stream, which follows records by time, sees a tunnel that lasted an hour; `started_at` and
// `duration_ms` say when it began and how long it took.
//
// A flow is recorded only once its caller is known (docs/decisions.md, "Every refusal is audited"):
// an authenticated agent, or a token whose signature verified though a claim refused it. A stranger's
// attempts are traced by the log line and dvx_gateway_auth_failures_total, never written into an org's
// log under claims anyone can type.

const ms = (n: number) => String(Math.round(n * 1000) / 1000);

/** The record of `flow` as it stands (no side effect). */
export function flowRecord(deps: GatewayDeps, flow: Flow): Record<string, unknown> {
  const identity = flow.identity;
  const snapshot = deps.snapshot();
  const attrs: Record<string, string> = {
    ...flow.attrs,
    started_at: flow.startedAt.toISOString(),
    bytes_up: String(flow.bytesUp),
    bytes_down: String(flow.bytesDown),
    duration_ms: ms(performance.now() - flow.started),
  };
  if (flow.findings.length > 0) attrs.findings = JSON.stringify(flow.findings);
  return {
    id: flow.id,
    event_time: new Date().toISOString(),
    kind: 'network_flow',
    action: flow.proto === 'tcp' ? 'connect' : 'http.request',
    actor: identity ? `agent:${identity.agentId}` : '',
    actor_kind: identity ? 'agent' : '',
    agent_id: identity?.agentId ?? '',
    agent_name: identity?.agentName ?? '',
    org_id: identity?.orgId ?? '',
    group_id: identity?.groupId ?? '',
    enclave_id: deps.options.enclaveId || snapshot.enclave.id,
    enclave_name: deps.options.enclaveName || snapshot.enclave.name,
    identified: identity !== null,
    proto: flow.proto,
    src: flow.src,
    src_ip: flow.srcIp,
    dst: flow.dst,
    dst_host: flow.dstHost,
    dst_ip: flow.dstIp,
    dst_port: flow.dstPort,
    outcome: flow.cutReason !== null ? 'deny' : flow.outcome,
    reason: flow.cutReason ?? flow.reason,
    source: 'gateway',
    attrs,
  };
}

/**
 * Appends `flow`'s record and counts it in the metrics, exactly once whoever calls (the door that
 * refused it, the tunnel that ended, the exchange that answered); a flow without a known caller is
 * counted but not recorded.
 */
export function recordFlow(deps: GatewayDeps, flow: Flow): void {
  if (flow.recorded) return;
  flow.recorded = true;
  const m = deps.metrics;
  m.flows.inc({ proto: flow.proto, outcome: flow.cutReason !== null ? 'deny' : flow.outcome });
  // A terminated tunnel's bytes are those of the requests inside it, each counted with its own flow.
  const counted = flow.attrs.intercepted !== 'true';
  if (counted && flow.bytesUp > 0) m.bytes.inc({ direction: 'up' }, flow.bytesUp);
  if (counted && flow.bytesDown > 0) m.bytes.inc({ direction: 'down' }, flow.bytesDown);
  m.duration.observe({ proto: flow.proto }, (performance.now() - flow.started) / 1000);
  if (flow.identity === null) {
    flow.settleWritten();
    return;
  }
  const record = flowRecord(deps, flow);
  deps.audit
    .append('network_flow', record)
    .catch((err: Error) => {
      deps.log.error({ err, flow_id: flow.id }, 'network_flow record lost');
    })
    .finally(() => flow.settleWritten());
}
