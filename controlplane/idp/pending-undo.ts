import type { JWK } from 'jose';
import type { Queryable } from '../../core/sql.ts';
import { auditedChangeBy, CONTROL_PLANE_ACTOR, type ChangeActor, type ChangeDeps } from '../audited-change.ts';
import { serviceAccountMetadata, type IdpProvisioner, type Registration } from './provisioner.ts';

// An IdP step (routes/service-accounts.ts: registering a service account's client, replacing its key
// set) is followed by a store change; if that change does not commit, the IdP step is undone: the
// client of an account never stored is removed, a key set the store does not hold is put back to the
// store's. The undo is persisted as an intent *before* the IdP is called, so that a crash at any point
// leaves a row behind (docs/decisions.md, "A failed IdP undo is kept, reported and retried"):
//
//   intent row (retry after the grace) ─▶ IdP step ─┬▶ failed: nothing to undo, row deleted
//                                                   └▶ registration recorded in the row ─▶ store change
//   store change commits, deleting the row in the same transaction ─▶ nothing left to undo
//   store change fails ─▶ undo attempted ─┬▶ ok: row deleted
//                                        └▶ failed: logged (err), counted, audited; row kept
//   every start, and every grace/2: rows past their grace claimed and attempted again
//
// A row is in flight while its request runs: the sweep leaves it alone until its grace (default 10
// min) has passed, so that a replica starting or sweeping never undoes another replica's change in
// progress. What to undo is decided from the store when the undo runs, never from a copy taken before:
// the client of an account the store holds active is not removed (the change committed after all), and
// the key set put back is the store's current one. A crash during the registration itself, before
// its answer was recorded, leaves an intent without a client id: the IdP's registration API cannot
// list clients, so that row is reported (logged, counted, audited with the client name and time, for
// the operator to check at the IdP) and then dropped.

export type UndoStep = 'remove' | 'update';

export interface PendingUndo {
  id: string | number;
  step: UndoStep;
  org_id: string;
  client_id: string;
  client_name: string;
  registration_client_uri: string;
  registration_access_token: string;
  cause: string;
  attempts: number;
  created_at: Date | string;
}

const registrationOf = (u: PendingUndo): Registration => ({
  client_id: u.client_id,
  registration_client_uri: u.registration_client_uri,
  registration_access_token: u.registration_access_token,
});
const message = (err: unknown) => (err instanceof Error ? err.message : String(err));

/**
 * Persists the intent to undo `step` before the IdP is called. `reg` is the client's registration when
 * it exists already (a key-set change), null before a registration. Throws when the store refuses:
 * the IdP must then not be called.
 */
export async function recordIntent(
  deps: ChangeDeps,
  graceMs: number,
  step: UndoStep,
  org: string,
  clientName: string,
  reg: Registration | null,
): Promise<PendingUndo> {
  const { rows } = await deps.db.query<PendingUndo>(
    `INSERT INTO idp_pending_undo (step, org_id, client_id, client_name, registration_client_uri, registration_access_token, cause, retry_after)
     VALUES ($1, $2, $3, $4, $5, $6, 'in progress', now() + make_interval(secs => $7)) RETURNING *`,
    [
      step,
      org,
      reg?.client_id ?? '',
      clientName,
      reg?.registration_client_uri ?? '',
      reg?.registration_access_token ?? '',
      graceMs / 1000,
    ],
  );
  return rows[0];
}

/**
 * Records the registration the IdP answered in the intent. If the store refuses, the client is
 * removed again at once (nothing else can find it) and the store's error is thrown.
 */
export async function recordRegistration(
  deps: ChangeDeps,
  idp: IdpProvisioner,
  intent: PendingUndo,
  reg: Registration,
): Promise<PendingUndo> {
  try {
    await deps.db.query(
      'UPDATE idp_pending_undo SET client_id = $2, registration_client_uri = $3, registration_access_token = $4 WHERE id = $1',
      [intent.id, reg.client_id, reg.registration_client_uri, reg.registration_access_token],
    );
  } catch (err) {
    deps.log.error(
      { err, client_id: reg.client_id, org_id: intent.org_id },
      'cannot record the IdP registration in its pending undo; removing the client now',
    );
    try {
      await idp.remove(reg);
    } catch (undoErr) {
      deps.metrics.idpUndoFailures.inc({ step: 'remove' });
      deps.log.error(
        {
          err: undoErr,
          client_id: reg.client_id,
          org_id: intent.org_id,
          registration_client_uri: reg.registration_client_uri,
        },
        'IdP undo failed and could not be persisted: remove this client at the IdP by hand',
      );
    }
    throw err;
  }
  return { ...intent, ...reg };
}

/** In the store change's transaction: the change commits, and with it the intent is gone. */
export async function settleIntent(tx: Queryable, intent: PendingUndo): Promise<void> {
  await tx.query('DELETE FROM idp_pending_undo WHERE id = $1', [intent.id]);
}

/** The IdP step itself failed: nothing was changed there, nothing to undo. Never throws. */
export async function dropIntent(deps: ChangeDeps, intent: PendingUndo): Promise<void> {
  try {
    await deps.db.query('DELETE FROM idp_pending_undo WHERE id = $1', [intent.id]);
  } catch (err) {
    // The row stays; its sweep finds nothing to undo (no client id, or the store's keys already there).
    deps.log.warn(
      { err, step: intent.step, client_id: intent.client_id },
      'cannot drop the intent of a failed IdP step; the sweep will',
    );
  }
}

/** Brings the IdP back in line with the store for one pending undo. */
async function attempt(deps: ChangeDeps, idp: IdpProvisioner, u: PendingUndo): Promise<void> {
  const { rows } = await deps.db.query<{ name: string; status: string }>(
    'SELECT name, status FROM service_accounts WHERE id = $1',
    [u.client_id],
  );
  const account = rows[0];
  if (u.step === 'remove') {
    // The store holds a live account with this client after all: the client is not an orphan.
    if (account?.status === 'active') return;
    return idp.remove(registrationOf(u));
  }
  // update: an account gone or disabled has no client to put keys back on.
  if (account?.status !== 'active') return;
  const keys = (
    await deps.db.query<{ public_jwk: string }>(
      'SELECT public_jwk FROM service_account_keys WHERE account_id = $1 ORDER BY created_at, key_id',
      [u.client_id],
    )
  ).rows.map((r) => JSON.parse(r.public_jwk) as JWK);
  return idp.update(registrationOf(u), serviceAccountMetadata(account.name, u.org_id, keys));
}

/**
 * Runs one pending undo: deleted when it succeeds (with `auditDone`, in an audited change: a retry at
 * start is a change of its own); otherwise logged, counted and audited, and left for the sweep. Never
 * throws: the caller's own error is the one its caller must see.
 */
async function run(
  deps: ChangeDeps,
  idp: IdpProvisioner,
  actor: ChangeActor,
  u: PendingUndo,
  auditDone: boolean,
): Promise<boolean> {
  try {
    await attempt(deps, idp, u);
  } catch (err) {
    deps.log.warn(
      { err, step: u.step, client_id: u.client_id, org_id: u.org_id, attempts: u.attempts + 1 },
      'IdP undo failed: the client stays pending and is retried',
    );
    deps.metrics.idpUndoFailures.inc({ step: u.step });
    const reason = `IdP ${u.step} of client ${u.client_id} failed: ${message(err)}`;
    await auditedChangeBy(deps, actor, 'service-account.idp-undo', u.org_id, async (tx) => {
      await tx.query(
        'UPDATE idp_pending_undo SET attempts = attempts + 1, last_error = $2, retry_after = now() WHERE id = $1',
        [u.id, message(err)],
      );
      return { result: null, resource: `idp-client:${u.client_id}`, outcome: 'deny' as const, reason };
    }).catch((auditErr: unknown) =>
      deps.log.error(
        { err: auditErr, client_id: u.client_id },
        'IdP undo failed and its audit record could not be written',
      ),
    );
    return false;
  }
  try {
    if (!auditDone) await deps.db.query('DELETE FROM idp_pending_undo WHERE id = $1', [u.id]);
    else {
      await auditedChangeBy(deps, actor, 'service-account.idp-undo', u.org_id, async (tx) => {
        await tx.query('DELETE FROM idp_pending_undo WHERE id = $1', [u.id]);
        return { result: null, resource: `idp-client:${u.client_id}` };
      });
    }
  } catch (err) {
    // Done at the IdP but not recorded: the row stays, and the sweep repeats the (idempotent) undo.
    deps.log.error(
      { err, client_id: u.client_id },
      'pending IdP undo done but its row could not be deleted (or its audit record written); kept for the sweep',
    );
    return false;
  }
  return true;
}

/**
 * Undoes an IdP step after the store change that followed it failed with `cause`. Never throws: the
 * route answers with `cause`, not with a failure of the undo.
 */
export async function undoIdpStep(
  deps: ChangeDeps,
  idp: IdpProvisioner,
  actor: ChangeActor,
  intent: PendingUndo,
  cause: unknown,
): Promise<void> {
  try {
    await deps.db.query('UPDATE idp_pending_undo SET cause = $2 WHERE id = $1', [intent.id, message(cause)]);
  } catch (err) {
    // Often the very failure being undone; the row keeps 'in progress' and the undo goes ahead.
    deps.log.warn(
      { err, step: intent.step, client_id: intent.client_id },
      'cannot record the cause of a pending IdP undo',
    );
  }
  await run(deps, idp, actor, { ...intent, cause: message(cause) }, false);
}

/**
 * A crash during a registration, before its answer was recorded: the client id is unknown and the
 * IdP cannot be asked for it. Reported (logged, counted, audited) for the operator, then dropped.
 */
async function reportLostRegistration(deps: ChangeDeps, u: PendingUndo): Promise<boolean> {
  const reason = `a registration of client "${u.client_name}" for org ${u.org_id} began at ${new Date(u.created_at).toISOString()} and was interrupted before its client id was recorded: check the IdP for an orphan client of that name`;
  deps.log.error({ client_name: u.client_name, org_id: u.org_id, started_at: u.created_at }, reason);
  deps.metrics.idpUndoFailures.inc({ step: u.step });
  try {
    await auditedChangeBy(deps, CONTROL_PLANE_ACTOR(), 'service-account.idp-undo', u.org_id, async (tx) => {
      await tx.query('DELETE FROM idp_pending_undo WHERE id = $1', [u.id]);
      return { result: null, resource: `idp-client-name:${u.client_name}`, outcome: 'deny' as const, reason };
    });
    return true;
  } catch (err) {
    deps.log.error(
      { err, client_name: u.client_name },
      'the report of an interrupted IdP registration could not be audited; kept for the sweep',
    );
    return false;
  }
}

/** Every pending undo past its grace, oldest first, each claimed (for another grace) before it runs. */
export async function retryPendingUndos(
  deps: ChangeDeps,
  idp: IdpProvisioner,
  graceMs: number,
): Promise<{ done: number; failed: number }> {
  const { rows } = await deps.db.query<{ id: string | number }>(
    'SELECT id FROM idp_pending_undo WHERE retry_after <= now() ORDER BY id',
  );
  let done = 0;
  let failed = 0;
  for (const { id } of rows) {
    // Claimed: a replica sweeping at the same time skips it (and so does this one until the grace ends).
    const claimed = await deps.db.query<PendingUndo>(
      'UPDATE idp_pending_undo SET retry_after = now() + make_interval(secs => $2) WHERE id = $1 AND retry_after <= now() RETURNING *',
      [id, graceMs / 1000],
    );
    const u = claimed.rows[0];
    if (!u) continue;
    const ok =
      u.client_id === '' ? await reportLostRegistration(deps, u) : await run(deps, idp, CONTROL_PLANE_ACTOR(), u, true);
    deps.metrics.idpUndoRetries.inc({ step: u.step, outcome: ok ? 'done' : 'failed' });
    if (ok) {
      done++;
      if (u.client_id !== '')
        deps.log.info({ step: u.step, client_id: u.client_id, org_id: u.org_id }, 'pending IdP undo done');
    } else failed++;
  }
  return { done, failed };
}

/**
 * The sweep: at once, then every half grace (at least every second), one run at a time; `stop` waits for the run in
 * flight.
 */
export function startUndoSweeper(deps: ChangeDeps, idp: IdpProvisioner, graceMs: number): { stop(): Promise<void> } {
  let running: Promise<void> = Promise.resolve();
  let stopped = false;
  const sweep = () => {
    running = retryPendingUndos(deps, idp, graceMs).then(
      ({ failed }) => void (failed > 0 && deps.log.warn({ failed }, 'IdP undos still pending after a retry')),
      (err: Error) => deps.log.error({ err }, 'retrying pending IdP undos failed'),
    );
    return running;
  };
  let timer: NodeJS.Timeout | null = null;
  const next = () => {
    if (stopped) return;
    timer = setTimeout(() => void sweep().then(next), Math.max(1000, graceMs / 2));
    timer.unref();
  };
  void sweep().then(next);
  return {
    stop: async () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
