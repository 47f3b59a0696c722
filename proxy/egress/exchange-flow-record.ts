import { performance } from 'node:perf_hooks';
import type { Flow, GatewayDeps } from './context.ts';

// STAND-IN for flow-record.ts's recordFlow (built beside this file; after the merge exchange.ts calls
// recordFlow and this file goes): appends a flow's `network_flow` record once and counts it.

export function recordExchangeFlow(deps: GatewayDeps, flow: Flow): void {
  if (flow.recorded) return;
  flow.recorded = true;
  const seconds = (performance.now() - flow.started) / 1000;
  const id = flow.identity;
  const o = deps.options;
  const record: Record<string, unknown> = {
    id: flow.id,
    event_time: flow.startedAt.toISOString(),
    kind: 'network_flow',
    action: flow.proto === 'tcp' ? 'connect' : 'http.request',
    actor: id ? `agent:${id.agentId}` : '',
    actor_kind: 'agent',
    agent_id: id?.agentId ?? '',
    agent_name: id?.agentName ?? '',
    org_id: id?.orgId ?? '',
    group_id: id?.groupId ?? '',
    enclave_id: o.enclaveId,
    enclave_name: o.enclaveName,
    identified: id !== null,
    proto: flow.proto,
    src: flow.src,
    src_ip: flow.srcIp,
    dst: flow.dst,
    dst_host: flow.dstHost,
    dst_ip: flow.dstIp,
    dst_port: flow.dstPort,
    outcome: flow.outcome,
    reason: flow.reason,
    source: 'gateway',
    attrs: {
      ...flow.attrs,
      bytes_up: String(flow.bytesUp),
      bytes_down: String(flow.bytesDown),
      duration_ms: String(Math.round(seconds * 1000)),
    },
  };
  deps.metrics.flows.inc({ proto: flow.proto, outcome: flow.outcome });
  deps.metrics.bytes.inc({ direction: 'up' }, flow.bytesUp);
  deps.metrics.bytes.inc({ direction: 'down' }, flow.bytesDown);
  deps.metrics.duration.observe({ proto: flow.proto }, seconds);
  deps.audit.append('network_flow', record).catch((err: unknown) => {
    deps.log.error({ err, flow_id: flow.id }, 'network_flow record lost');
  });
}
