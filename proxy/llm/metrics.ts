import type { Registry } from 'prom-client';
import { counter, gauge, histogram } from '../../core/metrics.ts';

// llmproxy's own metrics; the engine registers the inspection ones on the same registry.
const LATENCY = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];
const HELD = [0.05, 0.25, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600];
const BYTES = [1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 33554432];

export function proxyMetrics(registry: Registry) {
  return {
    requests: counter(registry, 'dvx_llmproxy_requests_total', 'Agent calls by wire format and status', [
      'format',
      'status',
    ]),
    overhead: histogram(
      registry,
      'dvx_llmproxy_overhead_seconds',
      'Time spent in the proxy, upstream time excluded',
      ['format'],
      LATENCY,
    ),
    upstream: histogram(
      registry,
      'dvx_llmproxy_upstream_seconds',
      'Upstream time to response headers',
      ['format'],
      LATENCY,
    ),
    requestBytes: histogram(registry, 'dvx_llmproxy_request_body_bytes', 'Request body size', ['format'], BYTES),
    responseBytes: histogram(registry, 'dvx_llmproxy_response_body_bytes', 'Response body size', ['format'], BYTES),
    upstreamTimeouts: counter(
      registry,
      'dvx_llmproxy_upstream_timeouts_total',
      'Upstream calls cut by --upstream-timeout (phase headers) or --upstream-idle-timeout (phase idle)',
      ['phase'],
    ),
    agentStalls: counter(
      registry,
      'dvx_llmproxy_agent_stalls_total',
      'Answers cut because the agent stopped reading them (nothing taken for --idle-timeout); their upstream is released',
      [],
    ),
    bufferedBodies: gauge(
      registry,
      'dvx_llmproxy_buffered_body_bytes',
      'Request body bytes held now (bounded by --max-buffered-bodies)',
      [],
    ),
    overloaded: counter(
      registry,
      'dvx_llmproxy_overloaded_total',
      'Calls answered 503 overloaded_error: their body did not fit in --max-buffered-bodies',
      [],
    ),
    callsCut: counter(
      registry,
      'dvx_llmproxy_calls_cut_total',
      'Open calls cut because a snapshot reload refused their agent (contained, suspended, isolated, another org, removed)',
      [],
    ),
    authFailures: counter(registry, 'dvx_llmproxy_auth_failures_total', 'Refused agent credentials', ['reason']),
    toolDecisions: counter(
      registry,
      'dvx_llmproxy_tool_decisions_total',
      "Tool calls decided, by the policy's verdict (allow, deny, require_approval) and what happened (allow, deny)",
      ['verdict', 'outcome'],
    ),
    toolHeld: histogram(
      registry,
      'dvx_llmproxy_tool_held_seconds',
      'How long a tool call that requires approval was held until it was decided, by outcome',
      ['outcome'],
      HELD,
    ),
  };
}

export type ProxyMetrics = ReturnType<typeof proxyMetrics>;
