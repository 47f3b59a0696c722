import type { Queryable } from '../../core/sql.ts';

// An org's IdP connectors in the store (spec: idpConnectorView). `client_secret` is stored (sealed by
// the caller) and never read back here.

export interface ConnectorRow {
  name: string;
  type: string;
  org_id: string;
  status: string;
  groups_attribute: string;
}

const COLUMNS = 'name, type, org_id, status, groups_attribute';

export async function listConnectors(db: Queryable, org: string): Promise<ConnectorRow[]> {
  return (await db.query<ConnectorRow>(`SELECT ${COLUMNS} FROM idp_connectors WHERE org_id = $1 ORDER BY name`, [org]))
    .rows;
}

export async function getConnector(db: Queryable, org: string, name: string): Promise<ConnectorRow | undefined> {
  return (
    await db.query<ConnectorRow>(`SELECT ${COLUMNS} FROM idp_connectors WHERE org_id = $1 AND name = $2`, [org, name])
  ).rows[0];
}

/** Create or replace; a null secret keeps the stored one. */
export async function upsertConnector(
  tx: Queryable,
  c: {
    org: string;
    name: string;
    type: string;
    issuer: string;
    metadataUrl: string;
    clientId: string;
    sealedSecret: string | null;
    groupsAttribute: string;
    scopes: string[];
  },
  createdBy: string,
): Promise<ConnectorRow> {
  const { rows } = await tx.query<ConnectorRow>(
    `INSERT INTO idp_connectors (org_id, name, type, issuer, metadata_url, client_id, client_secret, groups_attribute, scopes, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, coalesce($7, ''), $8, $9, $10)
     ON CONFLICT (org_id, name) DO UPDATE SET type = EXCLUDED.type, issuer = EXCLUDED.issuer, metadata_url = EXCLUDED.metadata_url,
       client_id = EXCLUDED.client_id, client_secret = coalesce($7, idp_connectors.client_secret),
       groups_attribute = EXCLUDED.groups_attribute, scopes = EXCLUDED.scopes
     RETURNING ${COLUMNS}`,
    [
      c.org,
      c.name,
      c.type,
      c.issuer,
      c.metadataUrl,
      c.clientId,
      c.sealedSecret,
      c.groupsAttribute,
      c.scopes,
      createdBy,
    ],
  );
  return rows[0];
}

/** False when there was no such connector. */
export async function deleteConnector(tx: Queryable, org: string, name: string): Promise<boolean> {
  return (
    (await tx.query('DELETE FROM idp_connectors WHERE org_id = $1 AND name = $2 RETURNING name', [org, name])).rows
      .length > 0
  );
}
