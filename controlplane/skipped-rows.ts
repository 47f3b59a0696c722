import type { SkippedRow } from '../pipeline/policy/store-snapshot.ts';
import type { ChangeDeps } from './audited-change.ts';

// A stored policy row the snapshot builder left out (it does not validate) is never silent: each one is
// logged with its coordinates and counted, every time a snapshot is built without it, until the row
// is rewritten or deleted. The served document names it too (`skipped`, docs/snapshot.md).

export function reportSkipped(
  deps: Pick<ChangeDeps, 'log' | 'metrics'>,
  snapshot: string,
  skipped: readonly SkippedRow[],
): void {
  for (const row of skipped) {
    deps.log.warn(
      { snapshot, scope: row.scope, key: row.key, reason: row.reason },
      'stored policy row does not validate: left out of the snapshot',
    );
    deps.metrics.policyRowsSkipped.inc({ key: row.key });
  }
}
