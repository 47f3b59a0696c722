import type { Logger } from '../core/logger.ts';
import type { Db } from '../core/sql.ts';
import type { AuditSink } from '../audit-wal/sink.ts';
import type { AuditStore } from '../audit-wal/store.ts';
import type { OrgKeys } from './crypto/org-keys.ts';
import { announceGrantsChanged, grantsChanged } from './authz/capabilities.ts';
import { completeErasure, recordKeyShredded, runningErasures, sweepOrgRows } from './store/erasures.ts';

// Per-org erasure (crypto-shred), restart-safe: every step is idempotent and the `erasures` row says
// where it is, so a sweep interrupted by a crash is run again from the top at the next start.
//   1. destroy the org's data key (everything sealed under it is unreadable from here on)
//   2. wait until this process's audit spool has shipped (so no record of the org ships after the sweep)
//   3. sweep the org's rows from the control plane's store, in one transaction
//   4. sweep them from the audit store (both tables)
//   5. mark the erasure complete with the number of rows swept

export interface ErasureDeps {
  db: Db;
  keys: OrgKeys | null;
  auditStore: AuditStore | null;
  audit: AuditSink;
  log: Logger;
}

export async function runErasure(deps: ErasureDeps, org: string): Promise<void> {
  const { db, log } = deps;
  const shredded = deps.keys ? await deps.keys.shred(org) : false;
  await recordKeyShredded(db, org, shredded);
  await (deps.audit.shipped ? deps.audit.shipped() : deps.audit.flush());
  const swept = await db.transaction(async (tx) => {
    const n = await sweepOrgRows(tx, org);
    await announceGrantsChanged(tx);
    return n;
  });
  grantsChanged(db); // the org's grants are gone: no cached authorization outlives them
  const audited = deps.auditStore ? await deps.auditStore.eraseOrg(org) : 0;
  await completeErasure(db, org, swept + audited);
  log.info({ org, key_shredded: shredded, rows_swept: swept + audited }, 'org erased');
}

/** At start: every erasure left running by a crash is run again. */
export async function resumeErasures(deps: ErasureDeps): Promise<string[]> {
  const orgs = await runningErasures(deps.db);
  for (const org of orgs) {
    deps.log.warn({ org }, 'resuming an interrupted erasure');
    await runErasure(deps, org);
  }
  return orgs;
}
