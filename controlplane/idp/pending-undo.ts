import type { JWK } from 'jose';
import { auditedChangeBy, CONTROL_PLANE_ACTOR, type ChangeActor, type ChangeDeps } from '../audited-change.ts';
import { serviceAccountMetadata, type IdpProvisioner, type Registration } from './provisioner.ts';

// Undoing an IdP step whose store change failed (routes/service-accounts.ts): a registered client
// whose account was never stored is removed; a key set changed at the IdP whose store change failed
// is put back to the keys the store holds. An undo that fails must not leave an orphan client (or a
// key the store does not know) behind without a trace:
//
//   persist the pending undo ─▶ attempt it ─▶ ok: delete the row
//                                          └─▶ failed: log (err), count, audit; the row stays
//   control-plane start ─▶ every pending row attempted again (same outcome handling)
//
// What to put back is read from the store when the undo runs, never from a copy taken before: a
// retry at start must not restore keys a later successful change replaced.

export type UndoStep = 'remove' | 'update';

export interface PendingUndo {
  id: string | number;
  step: UndoStep;
  org_id: string;
  client_id: string;
  registration_client_uri: string;
  registration_access_token: string;
  cause: string;
  attempts: number;
}

const registrationOf = (u: PendingUndo): Registration => ({ client_id: u.client_id, registration_client_uri: u.registration_client_uri, registration_access_token: u.registration_access_token });

/** Brings the IdP back in line with the store for one pending undo. */
async function attempt(deps: ChangeDeps, idp: IdpProvisioner, u: PendingUndo): Promise<void> {
  const { rows } = await deps.db.query<{ name: string; status: string }>('SELECT name, status FROM service_accounts WHERE id = $1', [u.client_id]);
  const account = rows[0];
  if (u.step === 'remove') {
    // The store holds a live account with this client after all: the client is not an orphan.
    if (account?.status === 'active') return;
    return idp.remove(registrationOf(u));
  }
  // update: an account gone or disabled has no client to put keys back on.
  if (!account || account.status !== 'active') return;
  const keys = (await deps.db.query<{ public_jwk: string }>('SELECT public_jwk FROM service_account_keys WHERE account_id = $1 ORDER BY created_at, key_id', [u.client_id])).rows.map((r) => JSON.parse(r.public_jwk) as JWK);
  return idp.update(registrationOf(u), serviceAccountMetadata(account.name, u.org_id, keys));
}

/**
 * Runs one pending undo: deleted when it succeeds (with `auditDone`, in an audited change: a retry at
 * start is a change of its own); otherwise logged, counted and audited, and left for the next start.
 */
async function run(deps: ChangeDeps, idp: IdpProvisioner, actor: ChangeActor, u: PendingUndo, auditDone: boolean): Promise<boolean> {
  try {
    await attempt(deps, idp, u);
  } catch (err) {
    deps.log.warn({ err, step: u.step, client_id: u.client_id, org_id: u.org_id, attempts: u.attempts + 1 }, 'IdP undo failed: the client stays pending and is retried at the next start');
    deps.metrics.idpUndoFailures.inc({ step: u.step });
    const reason = `IdP ${u.step} of client ${u.client_id} failed: ${(err as Error).message}`;
    await auditedChangeBy(deps, actor, 'service-account.idp-undo', u.org_id, async (tx) => {
      await tx.query('UPDATE idp_pending_undo SET attempts = attempts + 1, last_error = $2 WHERE id = $1', [u.id, (err as Error).message]);
      return { result: null, resource: `idp-client:${u.client_id}`, outcome: 'deny' as const, reason };
    }).catch((auditErr: unknown) => deps.log.error({ err: auditErr, client_id: u.client_id }, 'IdP undo failed and its audit record could not be written'));
    return false;
  }
  if (!auditDone) {
    await deps.db.query('DELETE FROM idp_pending_undo WHERE id = $1', [u.id]);
    return true;
  }
  try {
    await auditedChangeBy(deps, actor, 'service-account.idp-undo', u.org_id, async (tx) => {
      await tx.query('DELETE FROM idp_pending_undo WHERE id = $1', [u.id]);
      return { result: null, resource: `idp-client:${u.client_id}` };
    });
  } catch (err) {
    // Done at the IdP but not recorded: the row stays, and the next start repeats the (idempotent) undo.
    deps.log.error({ err, client_id: u.client_id }, 'pending IdP undo done but its audit record could not be written; kept for the next start');
    return false;
  }
  return true;
}

/**
 * Undoes an IdP step after the store change that followed it failed with `cause`. The undo is
 * persisted first, so that neither a failure of the undo nor a crash during it loses track of it.
 */
export async function undoIdpStep(deps: ChangeDeps, idp: IdpProvisioner, actor: ChangeActor, step: UndoStep, org: string, reg: Registration, cause: unknown): Promise<void> {
  const text = cause instanceof Error ? cause.message : String(cause);
  let pending: PendingUndo;
  try {
    const { rows } = await deps.db.query<PendingUndo>(
      `INSERT INTO idp_pending_undo (step, org_id, client_id, registration_client_uri, registration_access_token, cause) VALUES ($1, $2, $3, $4, $5, $6) RETURNING *`,
      [step, org, reg.client_id, reg.registration_client_uri, reg.registration_access_token, text],
    );
    pending = rows[0];
  } catch (err) {
    // The store refuses (often the very failure being undone): the undo is attempted all the same, and
    // if that fails too the client is named in the log, the only place left to name it.
    deps.log.error({ err, step, client_id: reg.client_id, org_id: org }, 'cannot persist the pending IdP undo; attempting it once');
    try {
      if (step === 'remove') await idp.remove(reg);
      else throw new Error('a key-set undo needs the store');
    } catch (undoErr) {
      deps.metrics.idpUndoFailures.inc({ step });
      deps.log.error({ err: undoErr, step, client_id: reg.client_id, org_id: org, registration_client_uri: reg.registration_client_uri }, 'IdP undo failed and could not be persisted: remove this client at the IdP by hand');
    }
    return;
  }
  await run(deps, idp, actor, pending, false);
}

/** At start: every pending undo attempted again, oldest first. */
export async function retryPendingUndos(deps: ChangeDeps, idp: IdpProvisioner): Promise<{ done: number; failed: number }> {
  const { rows } = await deps.db.query<PendingUndo>('SELECT * FROM idp_pending_undo ORDER BY id');
  let done = 0;
  for (const u of rows) {
    const ok = await run(deps, idp, CONTROL_PLANE_ACTOR(), u, true);
    deps.metrics.idpUndoRetries.inc({ step: u.step, outcome: ok ? 'done' : 'failed' });
    if (ok) {
      done++;
      deps.log.info({ step: u.step, client_id: u.client_id, org_id: u.org_id }, 'pending IdP undo done');
    }
  }
  return { done, failed: rows.length - done };
}
