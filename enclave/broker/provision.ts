import { chmod, lstat, mkdir, rm } from 'node:fs/promises';
import { join, resolve, sep } from 'node:path';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import type { Queryable } from '../../core/sql.ts';
import { AgentHostDirError } from '../errors.ts';
import { changeStatus } from './agents.ts';
import { issueBootstrapToken, tokenHash } from './bootstrap-tokens.ts';
import type { BrokerDeps } from './deps.ts';
import { revokeAgentFamilies } from './identity/refresh-tokens.ts';

// Provisioning (spec: States and transitions, "enclave provisions the agent"): the agent's status becomes
// `provisioning` (queued for the control plane), and a single-use bootstrap token bound to it is
// "injected into the agent's host": written atomically, mode 0600 in a 0700 directory, to
// `<agent-host-dir>/<uid>/bootstrap-token`. The uid comes from the control plane and names a directory,
// so one that is not a plain file name is refused: nothing is ever written outside --agent-host-dir.

export const TOKEN_FILE = 'bootstrap-token';

/** A uid usable as one path segment: no separator, no `..`, no NUL, no leading dot, not empty. */
export function isSafeUid(uid: string): boolean {
  return (
    uid.length > 0 &&
    uid.length <= 128 &&
    !uid.startsWith('.') &&
    !uid.includes('..') &&
    !/[/\\\0]/.test(uid) &&
    // Printable ASCII only: a control character or an exotic code point has no business in a file name.
    /^[\x21-\x7e]+$/.test(uid)
  );
}

/** The agent's directory under `dir`; throws for a uid that would leave it. */
export function agentDir(dir: string, uid: string): string {
  if (!isSafeUid(uid)) throw new AgentHostDirError('the agent uid is not a safe file name');
  const root = resolve(dir);
  const path = resolve(root, uid);
  if (!path.startsWith(root + sep) || path.slice(root.length + 1).includes(sep))
    throw new AgentHostDirError('the agent uid leaves the agent host directory');
  return path;
}

/**
 * Makes `<dir>/<uid>/` ready for a token (0700, created if absent) before anything is committed: a uid
 * that leaves `dir`, or a path there that is a symlink or a file, is refused.
 */
export async function prepareAgentHost(dir: string, uid: string): Promise<string> {
  const target = agentDir(dir, uid);
  try {
    await mkdir(resolve(dir), { recursive: true, mode: 0o700 });
    const existing = await lstat(target).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    if (existing && (existing.isSymbolicLink() || !existing.isDirectory()))
      throw new AgentHostDirError(`${target} is not a directory (a symlink or a file): refused`);
    if (!existing) await mkdir(target, { mode: 0o700 });
    await chmod(target, 0o700);
    return target;
  } catch (err) {
    if (err instanceof AgentHostDirError) throw err;
    throw new AgentHostDirError(`the host directory of agent ${uid} could not be prepared`, { cause: err });
  }
}

/** Writes the token to `<dir>/<uid>/bootstrap-token` (0600; the agent's directory 0700, never through a symlink). */
export async function placeBootstrapToken(dir: string, uid: string, token: string): Promise<string> {
  const file = join(await prepareAgentHost(dir, uid), TOKEN_FILE);
  try {
    await writeFileAtomic(file, token, { mode: 0o600 });
    return file;
  } catch (err) {
    throw new AgentHostDirError(`the bootstrap token of agent ${uid} could not be written`, { cause: err });
  }
}

/** Removes an agent's bootstrap-token file (its agent is gone); a uid that is not safe is left alone. */
export async function removeBootstrapToken(dir: string, uid: string): Promise<void> {
  if (!isSafeUid(uid)) return;
  await rm(join(agentDir(dir, uid), TOKEN_FILE), { force: true });
}

/** Whether the agent holds a refresh-token family that is not revoked and still has an unused, unexpired token. */
export async function hasLiveFamily(db: Queryable, uid: string, nowMs: number): Promise<boolean> {
  const { rows } = await db.query(
    `SELECT 1 FROM broker_token_families f JOIN broker_refresh_tokens r ON r.family_id = f.family_id
      WHERE f.agent_uid = $1 AND f.revoked_at IS NULL AND r.used_at IS NULL AND r.expires_at > $2 LIMIT 1`,
    [uid, new Date(nowMs)],
  );
  return rows.length > 0;
}

/**
 * Provisions `uid` inside `tx` (the caller's audited transaction): status provisioning (reported to the
 * control plane) and a new bootstrap token (voiding any unused one), returned for `deliverBootstrapToken`
 * once the transaction committed. The agent's directory is made ready first, so a host path that cannot
 * take the token refuses the change before anything is stored.
 */
export async function provisionIn(tx: Queryable, deps: BrokerDeps, uid: string, reason: string): Promise<string> {
  await prepareAgentHost(deps.options.agentHostDir, uid);
  await changeStatus(tx, uid, 'provisioning', reason);
  return issueBootstrapToken(tx, uid, deps.options.bootstrapTtl, deps.now());
}

/**
 * Writes a committed token into the agent's host. Written only after the commit, so the agent never
 * holds a token the store does not know yet; a write that fails voids the token (the agent stays
 * `provisioning` with no live token, which the next pull provisions again) and throws.
 */
export async function deliverBootstrapToken(deps: BrokerDeps, uid: string, token: string): Promise<void> {
  try {
    await placeBootstrapToken(deps.options.agentHostDir, uid, token);
  } catch (err) {
    await deps.db
      .query('DELETE FROM broker_bootstrap_tokens WHERE token_hash = $1 AND used_at IS NULL', [tokenHash(token)])
      .catch((voidErr: unknown) =>
        deps.log.error({ err: voidErr, agent: uid }, 'an undelivered bootstrap token could not be voided'),
      );
    throw err;
  }
}

/** Revokes everything an agent could authenticate with: its unused bootstrap tokens, its refresh-token families. */
export async function revokeCredentialsIn(tx: Queryable, uid: string, reason: string, nowMs: number): Promise<void> {
  await tx.query('DELETE FROM broker_bootstrap_tokens WHERE agent_uid = $1 AND used_at IS NULL', [uid]);
  await revokeAgentFamilies(tx, uid, reason, nowMs);
}

/**
 * Revokes everything an agent could authenticate with (its unused bootstrap tokens, its refresh-token
 * families) and forgets what the broker kept for it (its own config values, a pending status report).
 */
export async function forgetAgentIn(tx: Queryable, uid: string, reason: string, nowMs: number): Promise<void> {
  await tx.query('DELETE FROM broker_bootstrap_tokens WHERE agent_uid = $1', [uid]);
  await revokeAgentFamilies(tx, uid, reason, nowMs);
  await tx.query('DELETE FROM broker_agent_config WHERE agent_uid = $1', [uid]);
  await tx.query('DELETE FROM broker_status_outbox WHERE agent_uid = $1', [uid]);
  await tx.query('DELETE FROM broker_agents WHERE uid = $1', [uid]);
}
