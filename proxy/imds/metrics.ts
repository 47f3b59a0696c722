import type { Registry } from 'prom-client';
import { counter } from '../../core/metrics.ts';

// imds's own metrics (the socket's connection bounds register theirs, listener `imds`).
export function imdsMetrics(registry: Registry) {
  return {
    requests: counter(
      registry,
      'dvx_imds_requests_total',
      'Requests answered, by route (healthz, config, ca, credentials, credential, other) and status',
      ['route', 'status'],
    ),
  };
}

export type ImdsMetrics = ReturnType<typeof imdsMetrics>;
