import type { Queryable } from '../../core/sql.ts';

// The enclave registry in the store (spec: enclaveView). A broker key is kept as its SHA-256 only.

export interface EnclaveRow {
  id: string;
  name: string;
  owning_org_id: string;
  status: string;
  isolation_class: string;
  broker_url: string;
  relay_url: string;
  address_source: string;
  address_updated_at: Date | string | null;
}

const COLUMNS =
  'id, name, owning_org_id, status, isolation_class, broker_url, relay_url, address_source, address_updated_at';

export async function getEnclave(db: Queryable, id: string): Promise<EnclaveRow | undefined> {
  return (await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE id = $1`, [id])).rows[0];
}

/** Every enclave, or those owned by the orgs given; by name. */
export async function listEnclaves(db: Queryable, owningOrgs: string[] | 'all'): Promise<EnclaveRow[]> {
  const { rows } =
    owningOrgs === 'all'
      ? await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves ORDER BY name`)
      : await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE owning_org_id = ANY($1) ORDER BY name`, [
          owningOrgs,
        ]);
  return rows;
}

export async function enclaveNameTaken(db: Queryable, name: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM enclaves WHERE name = $1', [name])).rows.length > 0;
}

export async function enclaveExists(db: Queryable, id: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM enclaves WHERE id = $1', [id])).rows.length > 0;
}

/** The owning org of an enclave; undefined when there is no such enclave. */
export async function enclaveOwner(db: Queryable, id: string): Promise<string | undefined> {
  return (await db.query<{ owning_org_id: string }>('SELECT owning_org_id FROM enclaves WHERE id = $1', [id])).rows[0]
    ?.owning_org_id;
}

export async function insertEnclave(
  tx: Queryable,
  e: { id: string; name: string; owningOrg: string; brokerKeyHash: string },
  createdBy: string,
): Promise<void> {
  await tx.query(
    `INSERT INTO enclaves (id, name, owning_org_id, broker_key_hash, created_by) VALUES ($1, $2, $3, $4, $5)`,
    [e.id, e.name, e.owningOrg, e.brokerKeyHash, createdBy],
  );
}

export async function setBrokerKeyHash(tx: Queryable, id: string, hash: string): Promise<void> {
  await tx.query('UPDATE enclaves SET broker_key_hash = $2 WHERE id = $1', [id, hash]);
}

/** The enclave a broker key (its hash) belongs to. */
export async function enclaveByBrokerKey(db: Queryable, hash: string): Promise<EnclaveRow | undefined> {
  return (await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE broker_key_hash = $1`, [hash])).rows[0];
}

/** The hash of an enclave's current broker key; undefined once the enclave is deleted. */
export async function brokerKeyHash(db: Queryable, id: string): Promise<string | undefined> {
  return (await db.query<{ broker_key_hash: string }>('SELECT broker_key_hash FROM enclaves WHERE id = $1', [id]))
    .rows[0]?.broker_key_hash;
}

export async function setIsolationClass(tx: Queryable, id: string, isolationClass: string): Promise<void> {
  await tx.query('UPDATE enclaves SET isolation_class = $2 WHERE id = $1', [id, isolationClass]);
}

/** Deletes the enclave; its agents stay, placed nowhere. */
export async function deleteEnclave(tx: Queryable, id: string): Promise<void> {
  await tx.query(`UPDATE agents SET enclave_id = '' WHERE enclave_id = $1`, [id]);
  await tx.query('DELETE FROM enclaves WHERE id = $1', [id]);
}

export async function setEnclaveAddress(
  tx: Queryable,
  id: string,
  address: { broker: string | null; relay: string | null; source: string },
): Promise<EnclaveRow> {
  const { rows } = await tx.query<EnclaveRow>(
    `UPDATE enclaves SET broker_url = coalesce($2, broker_url), relay_url = coalesce($3, relay_url), address_source = $4, address_updated_at = now()
     WHERE id = $1 RETURNING ${COLUMNS}`,
    [id, address.broker, address.relay, address.source],
  );
  return rows[0];
}
