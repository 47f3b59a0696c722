import { randomBytes } from 'node:crypto';
import { newId } from '../../core/ids.ts';
import { open, seal, type Kms } from '../../core/kms.ts';
import type { Db } from '../../core/sql.ts';
import type { Sealer } from './deps.ts';

// The broker seals what it keeps secret (secret values, signing keys) under a data key of its own,
// AES-256-GCM; the data key is stored only wrapped by the KMS (core/kms.ts: the local key file, or a
// provider behind the same interface). Sealed values carry the id of the key that sealed them, so a
// new data key can be introduced while older values still open.

const FORMAT = /^dk1:([^:]+):(.+)$/s;

export async function openSealer(db: Db, kms: Kms): Promise<Sealer> {
  const keys = new Map<string, Buffer>();
  const load = async (id: string): Promise<Buffer> => {
    const known = keys.get(id);
    if (known) return known;
    const { rows } = await db.query<{ wrapped: string }>('SELECT wrapped FROM broker_data_keys WHERE id = $1', [id]);
    if (!rows[0]) throw new Error(`data key ${id} is not in the store`);
    const key = await kms.unwrap(rows[0].wrapped);
    keys.set(id, key);
    return key;
  };
  // The current key: the newest; created on first start. Replicas starting together agree on one.
  const current = await db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock($1)', [0x64767803]);
    const { rows } = await tx.query<{ id: string }>(
      'SELECT id FROM broker_data_keys ORDER BY created_at DESC, id LIMIT 1',
    );
    if (rows[0]) return rows[0].id;
    const id = newId();
    await tx.query('INSERT INTO broker_data_keys (id, wrapped) VALUES ($1, $2)', [id, await kms.wrap(randomBytes(32))]);
    return id;
  });
  const currentKey = await load(current);
  return {
    seal: async (plaintext) => `dk1:${current}:${seal(currentKey, Buffer.from(plaintext, 'utf8'))}`,
    open: async (sealed) => {
      const m = FORMAT.exec(sealed);
      if (!m) throw new Error('not a value sealed by this broker');
      return open(await load(m[1]!), m[2]!).toString('utf8');
    },
  };
}
