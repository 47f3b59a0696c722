import type { Registry } from 'prom-client';
import { counter, gauge, histogram } from '../../core/metrics.ts';

// The gateway's own metrics; the engine registers the inspection ones on the same registry.
const SECONDS = [0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 3600];

export function gatewayMetrics(registry: Registry) {
  return {
    flows: counter(
      registry,
      'dvx_gateway_flows_total',
      'Agent connection attempts and requests, by proto and outcome',
      ['proto', 'outcome'],
    ),
    bytes: counter(
      registry,
      'dvx_gateway_bytes_total',
      'Bytes carried for agents, by direction (up: to the destination)',
      ['direction'],
    ),
    duration: histogram(registry, 'dvx_gateway_flow_seconds', 'How long a flow lasted, by proto', ['proto'], SECONDS),
    authFailures: counter(registry, 'dvx_gateway_auth_failures_total', 'Refused agent credentials (407)', ['reason']),
    tunnelsOpen: gauge(registry, 'dvx_gateway_tunnels_open', 'CONNECT tunnels open now, by kind (blind, intercepted)', [
      'kind',
    ]),
    bufferedBodies: gauge(
      registry,
      'dvx_gateway_buffered_body_bytes',
      'Request body bytes held for inspection now (bounded by --max-buffered-bodies)',
      [],
    ),
    refusals: counter(
      registry,
      'dvx_gateway_refusals_total',
      'Attempts the gateway answered itself, by status (400, 403, 502, 503, 504, …)',
      ['status'],
    ),
  };
}

export type GatewayMetrics = ReturnType<typeof gatewayMetrics>;
