import { readdir, readFile } from 'node:fs/promises';
import type { Db } from '../../core/sql.ts';

// Versioned SQL migrations (store/migrations/NNNN_name.sql), applied at start in one transaction under
// an advisory lock (replicas starting together apply each once). Idempotent: applied versions are
// recorded and skipped; the SQL itself also uses IF NOT EXISTS.

const DIR = new URL('./migrations/', import.meta.url);
const LOCK_KEY = 0x64767801; // "dvx" + 1

export async function migrate(db: Db): Promise<string[]> {
  const files = (await readdir(DIR)).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort();
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock($1)', [LOCK_KEY]);
    await tx.query(
      'CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())',
    );
    const done = new Set(
      (await tx.query<{ version: string }>('SELECT version FROM schema_migrations')).rows.map((r) => r.version),
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
      await tx.query('INSERT INTO schema_migrations (version) VALUES ($1)', [version]);
      applied.push(version);
    }
    return applied;
  });
}
