import { createHash, randomBytes } from 'node:crypto';
import type { Queryable } from '../../core/sql.ts';

// Single-use bootstrap tokens (spec: States and transitions): one is minted when the broker provisions an
// agent and written into the agent's host; the agent trades it once for its identity bundle. Only the
// SHA-256 of a token is stored. Minting a new one for an agent voids the ones it had not used, so at
// most one is live per agent.

const PREFIX = 'dvxb_';
const SHAPE = /^dvxb_[A-Za-z0-9_-]{43}$/;

export const tokenHash = (token: string): string => createHash('sha256').update(token).digest('hex');

/** Mints a bootstrap token for `uid`, voiding its unused ones. Returns the token (never stored). */
export async function issueBootstrapToken(tx: Queryable, uid: string, ttlMs: number, nowMs: number): Promise<string> {
  const token = PREFIX + randomBytes(32).toString('base64url');
  await tx.query('DELETE FROM broker_bootstrap_tokens WHERE agent_uid = $1 AND used_at IS NULL', [uid]);
  await tx.query(
    'INSERT INTO broker_bootstrap_tokens (token_hash, agent_uid, created_at, expires_at) VALUES ($1, $2, $3, $4)',
    [tokenHash(token), uid, new Date(nowMs), new Date(nowMs + ttlMs)],
  );
  return token;
}

/**
 * Uses a bootstrap token: the agent it was minted for, or null when it is malformed, unknown, used or
 * expired. Atomic: of concurrent redemptions of one token exactly one gets the agent.
 */
export async function redeemBootstrapToken(tx: Queryable, token: unknown, nowMs: number): Promise<string | null> {
  if (typeof token !== 'string' || !SHAPE.test(token)) return null;
  const { rows } = await tx.query<{ agent_uid: string }>(
    `UPDATE broker_bootstrap_tokens SET used_at = $2
      WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2
      RETURNING agent_uid`,
    [tokenHash(token), new Date(nowMs)],
  );
  return rows[0]?.agent_uid ?? null;
}

/** Whether `uid` holds a bootstrap token it has not used yet (and that has not expired). */
export async function hasLiveBootstrapToken(tx: Queryable, uid: string, nowMs: number): Promise<boolean> {
  const { rows } = await tx.query(
    'SELECT 1 FROM broker_bootstrap_tokens WHERE agent_uid = $1 AND used_at IS NULL AND expires_at > $2 LIMIT 1',
    [uid, new Date(nowMs)],
  );
  return rows.length > 0;
}

/**
 * Deletes the tokens that can no longer be used (used or expired). A used one is not needed to refuse
 * it: a token the store does not know is refused the same way.
 */
export async function pruneBootstrapTokens(db: Queryable, nowMs: number): Promise<void> {
  await db.query('DELETE FROM broker_bootstrap_tokens WHERE used_at IS NOT NULL OR expires_at <= $1', [
    new Date(nowMs),
  ]);
}
