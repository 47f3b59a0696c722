import { randomBytes } from 'node:crypto';
import { newId } from '../../../core/ids.ts';
import type { Queryable } from '../../../core/sql.ts';
import { tokenHash } from '../bootstrap-tokens.ts';

// Refresh tokens (spec: the renewal exchange): single use and rotating, each belonging to a family that a
// bootstrap starts. A rotation uses the presented token and issues its successor in the same family; a
// token presented after it was used is a replay — someone holds a copy — and the whole family is revoked
// (its newest token with it). Only the SHA-256 of a token is stored. A token left unused expires after
// --refresh-ttl; a used one is kept until then too, so a replay within that time is recognised.

const PREFIX = 'dvxr_';
const SHAPE = /^dvxr_[A-Za-z0-9_-]{43}$/;

export type Rotation =
  /** The token was live: it is used now, `next` is its successor. */
  | { ok: true; uid: string; familyId: string; next: string }
  /** The token had been used already: its family is revoked by this call. */
  | { replayed: true; uid: string; familyId: string }
  /** The token's family was revoked before (a replay, a new bootstrap, an operator): nothing changes. */
  | { revoked: true; uid: string; familyId: string; reason: string | null };

async function issue(tx: Queryable, familyId: string, uid: string, ttlMs: number, nowMs: number): Promise<string> {
  const token = PREFIX + randomBytes(32).toString('base64url');
  await tx.query(
    `INSERT INTO broker_refresh_tokens (token_hash, family_id, agent_uid, created_at, expires_at)
     VALUES ($1, $2, $3, $4, $5)`,
    [tokenHash(token), familyId, uid, new Date(nowMs), new Date(nowMs + ttlMs)],
  );
  return token;
}

/** Starts a token family for `uid` (a bootstrap): its id and first token (returned, never stored). */
export async function startFamily(
  tx: Queryable,
  uid: string,
  ttlMs: number,
  nowMs: number,
): Promise<{ familyId: string; token: string }> {
  const familyId = newId();
  await tx.query('INSERT INTO broker_token_families (family_id, agent_uid, created_at) VALUES ($1, $2, $3)', [
    familyId,
    uid,
    new Date(nowMs),
  ]);
  return { familyId, token: await issue(tx, familyId, uid, ttlMs, nowMs) };
}

/**
 * Uses a refresh token and issues its successor. Null for a malformed, unknown or expired token.
 * Atomic: of concurrent rotations of one token one wins; the others find it used, which is a replay.
 */
export async function rotate(tx: Queryable, token: unknown, ttlMs: number, nowMs: number): Promise<Rotation | null> {
  if (typeof token !== 'string' || !SHAPE.test(token)) return null;
  const hash = tokenHash(token);
  const now = new Date(nowMs);
  const { rows } = await tx.query<{ agent_uid: string; family_id: string }>(
    `UPDATE broker_refresh_tokens t SET used_at = $2
       FROM broker_token_families f
      WHERE t.token_hash = $1 AND t.used_at IS NULL AND t.expires_at > $2
        AND f.family_id = t.family_id AND f.revoked_at IS NULL
      RETURNING t.agent_uid, t.family_id`,
    [hash, now],
  );
  if (rows[0]) {
    const { agent_uid: uid, family_id: familyId } = rows[0];
    return { ok: true, uid, familyId, next: await issue(tx, familyId, uid, ttlMs, nowMs) };
  }
  const found = await tx.query<{
    agent_uid: string;
    family_id: string;
    used_at: Date | null;
    revoked_at: Date | null;
    revoked_reason: string | null;
  }>(
    `SELECT t.agent_uid, t.family_id, t.used_at, f.revoked_at, f.revoked_reason
       FROM broker_refresh_tokens t JOIN broker_token_families f ON f.family_id = t.family_id
      WHERE t.token_hash = $1`,
    [hash],
  );
  const row = found.rows[0];
  if (!row) return null;
  const ids = { uid: row.agent_uid, familyId: row.family_id };
  if (row.revoked_at !== null) return { revoked: true, ...ids, reason: row.revoked_reason };
  if (row.used_at === null) return null; // unused, so expired
  await revokeFamily(tx, row.family_id, 'replayed', nowMs);
  return { replayed: true, ...ids };
}

/** What `rotate` would find for `token`, changing nothing (the exchange prepares its answer on it). */
export async function peekRefreshToken(
  db: Queryable,
  token: unknown,
  nowMs: number,
): Promise<{ uid: string; familyId: string; state: 'live' | 'used' | 'revoked' } | null> {
  if (typeof token !== 'string' || !SHAPE.test(token)) return null;
  const { rows } = await db.query<{
    agent_uid: string;
    family_id: string;
    used_at: Date | null;
    expires_at: Date | string;
    revoked_at: Date | null;
  }>(
    `SELECT t.agent_uid, t.family_id, t.used_at, t.expires_at, f.revoked_at
       FROM broker_refresh_tokens t JOIN broker_token_families f ON f.family_id = t.family_id
      WHERE t.token_hash = $1`,
    [tokenHash(token)],
  );
  const row = rows[0];
  if (!row) return null;
  const ids = { uid: row.agent_uid, familyId: row.family_id };
  if (row.revoked_at !== null) return { ...ids, state: 'revoked' };
  if (row.used_at !== null) return { ...ids, state: 'used' };
  return new Date(row.expires_at).getTime() > nowMs ? { ...ids, state: 'live' } : null;
}

/** Revokes one family (its tokens can no longer be rotated). */
export async function revokeFamily(tx: Queryable, familyId: string, reason: string, nowMs: number): Promise<void> {
  await tx.query(
    'UPDATE broker_token_families SET revoked_at = $2, revoked_reason = $3 WHERE family_id = $1 AND revoked_at IS NULL',
    [familyId, new Date(nowMs), reason],
  );
}

/** Revokes every live family of an agent; returns how many. */
export async function revokeAgentFamilies(tx: Queryable, uid: string, reason: string, nowMs: number): Promise<number> {
  const { rows } = await tx.query(
    `UPDATE broker_token_families SET revoked_at = $2, revoked_reason = $3
      WHERE agent_uid = $1 AND revoked_at IS NULL RETURNING family_id`,
    [uid, new Date(nowMs), reason],
  );
  return rows.length;
}

/** Deletes expired tokens, then the families left without a token. */
export async function pruneRefreshTokens(db: Queryable, nowMs: number): Promise<void> {
  await db.query('DELETE FROM broker_refresh_tokens WHERE expires_at <= $1', [new Date(nowMs)]);
  await db.query(
    `DELETE FROM broker_token_families f
      WHERE NOT EXISTS (SELECT 1 FROM broker_refresh_tokens t WHERE t.family_id = f.family_id)`,
  );
}
