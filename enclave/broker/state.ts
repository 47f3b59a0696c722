import type { Queryable } from '../../core/sql.ts';

// Small documents the broker keeps across restarts (broker_state): the last good snapshot and config
// pulled from the control plane, and its place in the control plane's event stream. With them the
// broker serves its agents while the control plane is unreachable and resumes where it was.

export type StateKey = 'snapshot' | 'config' | 'events_cursor';

/** The stored value of `key`, or null when there is none. */
export async function getState<T = unknown>(db: Queryable, key: StateKey): Promise<T | null> {
  const { rows } = await db.query<{ value: T }>('SELECT value FROM broker_state WHERE key = $1', [key]);
  return rows.length > 0 ? rows[0].value : null;
}

/** Replaces the value of `key`. */
export async function putState(db: Queryable, key: StateKey, value: unknown): Promise<void> {
  await db.query(
    `INSERT INTO broker_state (key, value, updated_at) VALUES ($1, $2::jsonb, now())
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()`,
    [key, JSON.stringify(value)],
  );
}
