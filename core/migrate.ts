import { readdir, readFile } from 'node:fs/promises';
import type { Db } from './sql.ts';

// Versioned SQL migrations (a component's DIR/NNNN_name.sql), applied at start in one transaction under
// an advisory lock (replicas starting together apply each once). Idempotent: applied versions are
// recorded in the component's own table and skipped; the SQL itself also uses IF NOT EXISTS.

export interface MigrationSet {
  /** The directory of NNNN_name.sql files. */
  dir: URL;
  /** The advisory lock replicas of this component take. */
  lockKey: number;
  /** Where applied versions are recorded. */
  table: string;
}

export async function migrate(db: Db, set: MigrationSet): Promise<string[]> {
  const { dir: DIR, lockKey: LOCK_KEY, table } = set;
  if (!/^[a-z_]+$/.test(table)) throw new Error(`migration table ${table} is not a plain name`);
  const files = (await readdir(DIR)).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort();
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock($1)', [LOCK_KEY]);
    await tx.query(
      `CREATE TABLE IF NOT EXISTS ${table} (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const done = new Set(
      (await tx.query<{ version: string }>(`SELECT version FROM ${table}`)).rows.map((r) => r.version),
    );
    const applied: string[] = [];
    for (const file of files) {
      const version = file.slice(0, 4);
      if (done.has(version)) continue;
      const sql = await readFile(new URL(file, DIR), 'utf8');
      for (const statement of sql
        .split(/;\s*$/m)
        .map((s) => s.trim())
        .filter((s) => s && !/^(--[^\n]*\n?)+$/.test(s))) {
        await tx.query(statement);
      }
      await tx.query(`INSERT INTO ${table} (version) VALUES ($1)`, [version]);
      applied.push(version);
    }
    return applied;
  });
}
