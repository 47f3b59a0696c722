import type { Logger } from '../core/logger.ts';
import type { Db } from '../core/sql.ts';
import type { AuditSink } from '../audit-wal/sink.ts';
import type { AuditStore } from '../audit-wal/store.ts';
import type { OrgKeys } from './crypto/org-keys.ts';
import { announceGrantsChanged, grantsChanged } from './authz/capabilities.ts';

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

// Tables holding an org's rows, with the column naming the org (children before parents).
const ORG_TABLES: [string, string][] = [
  ['events', `enclave_id IN (SELECT id FROM enclaves WHERE owning_org_id = $1)`],
  ['pack_installs', 'org_id = $1'],
  ['governance_policy', 'org_id = $1'],
  ['config_values', 'org_id = $1'],
  ['service_config', 'org_id = $1'],
  ['agent_config', 'org_id = $1'],
  ['feature_flags', 'org_id = $1'],
  ['idp_connectors', 'org_id = $1'],
  ['service_account_keys', 'account_id IN (SELECT id FROM service_accounts WHERE org_id = $1)'],
  ['service_accounts', 'org_id = $1'],
  ['grants', 'org_id = $1'],
  ['memberships', 'org_id = $1'],
  ['members', 'org_id = $1'],
  ['agents', 'org_id = $1'],
  ['enclaves', 'owning_org_id = $1'],
  ['org_groups', 'org_id = $1'],
  ['roles', 'org_id = $1'],
  ['orgs', 'id = $1'],
];

export async function runErasure(deps: ErasureDeps, org: string): Promise<void> {
  const { db, log } = deps;
  const shredded = deps.keys ? await deps.keys.shred(org) : false;
  await db.query('UPDATE erasures SET key_shredded = $2 WHERE org_id = $1', [org, shredded]);
  await (deps.audit.shipped ? deps.audit.shipped() : deps.audit.flush());
  const swept = await db.transaction(async (tx) => {
    let n = 0;
    for (const [table, where] of ORG_TABLES) {
      const { rows } = await tx.query<{ n: number }>(`WITH gone AS (DELETE FROM ${table} WHERE ${where} RETURNING 1) SELECT count(*)::int AS n FROM gone`, [org]);
      n += Number(rows[0].n);
    }
    await announceGrantsChanged(tx);
    return n;
  });
  grantsChanged(db); // the org's grants are gone: no cached authorization outlives them
  const audited = deps.auditStore ? await deps.auditStore.eraseOrg(org) : 0;
  await db.query(`UPDATE erasures SET status = 'complete', rows_swept = rows_swept + $2, completed_at = now() WHERE org_id = $1`, [org, swept + audited]);
  log.info({ org, key_shredded: shredded, rows_swept: swept + audited }, 'org erased');
}

/** At start: every erasure left running by a crash is run again. */
export async function resumeErasures(deps: ErasureDeps): Promise<string[]> {
  const { rows } = await deps.db.query<{ org_id: string }>(`SELECT org_id FROM erasures WHERE status = 'running' ORDER BY requested_at`);
  for (const r of rows) {
    deps.log.warn({ org: r.org_id }, 'resuming an interrupted erasure');
    await runErasure(deps, r.org_id);
  }
  return rows.map((r) => r.org_id);
}
