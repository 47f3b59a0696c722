import { migrate as migrateSet, type MigrationSet } from '../../../core/migrate.ts';
import type { Db } from '../../../core/sql.ts';

// The broker's migrations (store/migrations/NNNN_name.sql), applied by core/migrate.ts and recorded in
// their own table, so a broker never reads the control plane's versions as its own.

export const BROKER_MIGRATIONS: MigrationSet = {
  dir: new URL('./migrations/', import.meta.url),
  lockKey: 0x64767802, // "dvx" + 2
  table: 'broker_schema_migrations',
};

export const migrate = (db: Db): Promise<string[]> => migrateSet(db, BROKER_MIGRATIONS);
