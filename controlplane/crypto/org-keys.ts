import { randomBytes } from 'node:crypto';
import type { Queryable } from '../../core/sql.ts';
import { open, seal, type Kms } from '../../core/kms.ts';
import { OrgKeyShredded } from '../errors.ts';

// Per-org data keys: created on first use, stored wrapped by the KMS (`org_keys`), cached unwrapped in
// memory. Shredding deletes the wrapped key (and the cache entry): every value sealed under it becomes
// unreadable for good. Sealed values read "enc:v1:<base64 iv|tag|ciphertext>".
//
// Sealed columns (the documented list, docs/decisions.md): config_values.value,
// idp_connectors.client_secret, and the `attrs` of audit records the control plane writes.

const PREFIX = 'enc:v1:';

export class OrgKeys {
  #db: Queryable;
  #kms: Kms;
  #cache = new Map<string, Buffer>();

  constructor(db: Queryable, kms: Kms) {
    this.#db = db;
    this.#kms = kms;
  }

  async #key(org: string, create: boolean): Promise<Buffer | null> {
    const hit = this.#cache.get(org);
    if (hit) return hit;
    const { rows } = await this.#db.query<{ wrapped: string | null }>(
      'SELECT wrapped FROM org_keys WHERE org_id = $1',
      [org],
    );
    if (rows[0] && rows[0].wrapped === null) throw new OrgKeyShredded(`the data key of org ${org} was shredded`);
    let key: Buffer;
    if (rows[0]) key = await this.#kms.unwrap(rows[0].wrapped!);
    else {
      if (!create) return null;
      key = randomBytes(32);
      const wrapped = await this.#kms.wrap(key);
      await this.#db.query(
        'INSERT INTO org_keys (org_id, wrapped, provider) VALUES ($1, $2, $3) ON CONFLICT (org_id) DO NOTHING',
        [org, wrapped, this.#kms.provider],
      );
      // Another replica may have won the race: use what is stored.
      const again = await this.#db.query<{ wrapped: string | null }>('SELECT wrapped FROM org_keys WHERE org_id = $1', [
        org,
      ]);
      if (again.rows[0]?.wrapped == null) throw new OrgKeyShredded(`the data key of org ${org} was shredded`);
      key = await this.#kms.unwrap(again.rows[0].wrapped);
    }
    this.#cache.set(org, key);
    return key;
  }

  async seal(org: string, plaintext: string): Promise<string> {
    const key = await this.#key(org, true);
    return PREFIX + seal(key!, Buffer.from(plaintext, 'utf8'));
  }

  /** The plaintext of a sealed value (a value that is not sealed is returned as is). */
  async open(org: string, value: string): Promise<string> {
    if (!value.startsWith(PREFIX)) return value;
    const key = await this.#key(org, false);
    if (!key) throw new OrgKeyShredded(`org ${org} has no data key`);
    return open(key, value.slice(PREFIX.length)).toString('utf8');
  }

  /** Destroys the org's key: the wrapped copy is overwritten with NULL and forgotten here. */
  async shred(org: string): Promise<boolean> {
    this.#cache.delete(org);
    const { rows } = await this.#db.query<{ org_id: string }>(
      `INSERT INTO org_keys (org_id, wrapped, provider, shredded_at) VALUES ($1, NULL, '', now())
       ON CONFLICT (org_id) DO UPDATE SET wrapped = NULL, shredded_at = coalesce(org_keys.shredded_at, now()) RETURNING org_id`,
      [org],
    );
    return rows.length > 0;
  }

  forget(org: string): void {
    this.#cache.delete(org);
  }
}

export const isSealed = (v: unknown): v is string => typeof v === 'string' && v.startsWith(PREFIX);
