import type { Registry } from 'prom-client';
import { counter } from '../core/metrics.ts';

// The control plane's own metrics: failures it survives but an operator must see. Registered on the
// registry `startControlPlane` is given (tests pass a fresh one and read exact values).

export function controlPlaneMetrics(registry: Registry) {
  return {
    policyRowsSkipped: counter(
      registry,
      'dvx_controlplane_policy_rows_skipped_total',
      'Stored policy rows left out of a built snapshot because they do not validate',
      ['key'],
    ),
    idpUndoFailures: counter(
      registry,
      'dvx_controlplane_idp_undo_failures_total',
      'IdP undo steps that failed and were left pending for a retry',
      ['step'],
    ),
    storeConnectionErrors: counter(
      registry,
      'dvx_controlplane_store_connection_errors_total',
      'Store connections that failed outside a query (connection: pool for an idle pooled one, listen for the LISTEN one, which reconnects)',
      ['connection'],
    ),
    idpUndoRetries: counter(
      registry,
      'dvx_controlplane_idp_undo_retries_total',
      'Pending IdP undo steps retried (at start and by the periodic sweep), by outcome',
      ['step', 'outcome'],
    ),
  };
}

export type ControlPlaneMetrics = ReturnType<typeof controlPlaneMetrics>;
