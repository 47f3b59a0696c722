import type { JWK } from 'jose';
import type { Queryable } from '../../core/sql.ts';

// Service accounts and their public keys in the store (spec: serviceAccountView). An account's id is
// its client id at the IdP; the registration fields let the control plane change or remove the client.

export interface AccountRow {
  id: string;
  org_id: string;
  name: string;
  owner: string;
  level: string;
  status: string;
  registration_client_uri: string;
  registration_access_token: string;
  created_at: Date | string;
}

export async function getServiceAccount(db: Queryable, org: string, id: string): Promise<AccountRow | undefined> {
  return (await db.query<AccountRow>('SELECT * FROM service_accounts WHERE org_id = $1 AND id = $2', [org, id]))
    .rows[0];
}

export async function listServiceAccounts(db: Queryable, org: string): Promise<AccountRow[]> {
  return (await db.query<AccountRow>('SELECT * FROM service_accounts WHERE org_id = $1 ORDER BY created_at, id', [org]))
    .rows;
}

/** A new account, registered at the IdP as `reg`, owned by its creator. */
export async function insertServiceAccount(
  tx: Queryable,
  a: { org: string; name: string; owner: string; level: string },
  reg: { client_id: string; registration_client_uri: string; registration_access_token: string },
): Promise<AccountRow> {
  const { rows } = await tx.query<AccountRow>(
    `INSERT INTO service_accounts (id, org_id, name, owner, level, registration_client_uri, registration_access_token, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $4) RETURNING *`,
    [reg.client_id, a.org, a.name, a.owner, a.level, reg.registration_client_uri, reg.registration_access_token],
  );
  return rows[0];
}

export async function addServiceAccountKey(tx: Queryable, account: string, kid: string, publicJwk: JWK): Promise<void> {
  await tx.query('INSERT INTO service_account_keys (account_id, key_id, public_jwk) VALUES ($1, $2, $3)', [
    account,
    kid,
    JSON.stringify(publicJwk),
  ]);
}

/** An account's public keys, oldest first. */
export async function serviceAccountKeys(
  db: Queryable,
  account: string,
): Promise<{ key_id: string; public_jwk: string }[]> {
  return (
    await db.query<{ key_id: string; public_jwk: string }>(
      'SELECT key_id, public_jwk FROM service_account_keys WHERE account_id = $1 ORDER BY created_at, key_id',
      [account],
    )
  ).rows;
}

export async function deleteServiceAccountKey(tx: Queryable, account: string, kid: string): Promise<void> {
  await tx.query('DELETE FROM service_account_keys WHERE account_id = $1 AND key_id = $2', [account, kid]);
}

export async function setServiceAccountOwner(tx: Queryable, account: string, owner: string): Promise<AccountRow> {
  return (
    await tx.query<AccountRow>('UPDATE service_accounts SET owner = $2 WHERE id = $1 RETURNING *', [account, owner])
  ).rows[0];
}

export async function disableServiceAccount(tx: Queryable, account: string): Promise<AccountRow> {
  return (
    await tx.query<AccountRow>(`UPDATE service_accounts SET status = 'disabled' WHERE id = $1 RETURNING *`, [account])
  ).rows[0];
}

/** An account's status (`active`, `disabled`); undefined for a subject that is no service account. */
export async function serviceAccountStatus(db: Queryable, id: string): Promise<string | undefined> {
  return (await db.query<{ status: string }>('SELECT status FROM service_accounts WHERE id = $1', [id])).rows[0]
    ?.status;
}
