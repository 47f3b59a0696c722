import { migrate as migrateSet, type MigrationSet } from '../../core/migrate.ts';
import type { Db } from '../../core/sql.ts';

// The control plane's migrations (store/migrations/NNNN_name.sql), applied by core/migrate.ts.

export const CONTROLPLANE_MIGRATIONS: MigrationSet = {
  dir: new URL('./migrations/', import.meta.url),
  lockKey: 0x64767801, // "dvx" + 1
  table: 'schema_migrations',
};

export const migrate = (db: Db): Promise<string[]> => migrateSet(db, CONTROLPLANE_MIGRATIONS);
