import pg from 'pg';
import type { Logger } from '../../core/logger.ts';
import { coalesced } from '../../core/coalesce.ts';
import { openDb, type Db } from '../../core/sql.ts';
import type { Snapshot } from '../../pipeline/policy/snapshot.ts';
import { CHANGES_CHANNEL, enclaveSnapshot, wholeSnapshot } from '../../pipeline/policy/store-snapshot.ts';

// llmproxy --database-dsn: policy, flags and agents read straight from the control plane's tables,
// through the same snapshot builder and validator the enclaves' pullers receive, as the alternative to
// --policy-snapshot (spec: "the pipeline is built whenever the proxy has a database connection").
// Reloaded when the control plane commits a change (LISTEN on its NOTIFY channel) and every 30 s as a
// safety net; each reload invalidates the resolved-policy cache. A failed reload keeps the last good
// state. PostgreSQL only: an embedded PGlite store belongs to the control plane's process.

const SAFETY_RELOAD_MS = 30_000;

export class StoreSnapshotSource {
  #db: Db;
  #listener: pg.Client | null = null;
  #enclaveId: string;
  #log: Logger;
  #onChange: () => void;
  #value: Snapshot;
  #timer: NodeJS.Timeout;
  #closed = false;

  private constructor(db: Db, enclaveId: string, log: Logger, onChange: () => void, first: Snapshot) {
    this.#db = db;
    this.#enclaveId = enclaveId;
    this.#log = log;
    this.#onChange = onChange;
    this.#value = first;
    this.#timer = setInterval(() => void this.reload(), SAFETY_RELOAD_MS);
    this.#timer.unref();
  }

  static async open(options: {
    dsn: string;
    enclaveId: string;
    log: Logger;
    onChange: () => void;
  }): Promise<StoreSnapshotSource> {
    const db = await openDb(options.dsn);
    let first: Snapshot;
    try {
      first = await StoreSnapshotSource.#load(db, options.enclaveId, options.log);
    } catch (err) {
      await db.close();
      throw new Error(`--database-dsn: cannot read the policy store: ${(err as Error).message}`);
    }
    const source = new StoreSnapshotSource(db, options.enclaveId, options.log, options.onChange, first);
    await source.#listen(options.dsn);
    return source;
  }

  static async #load(db: Db, enclaveId: string, log: Logger): Promise<Snapshot> {
    const s = enclaveId ? await enclaveSnapshot(db, enclaveId) : await wholeSnapshot(db);
    if (!s) throw new Error(`no enclave ${enclaveId} in the store`);
    // A stored row that does not validate is left out (the rest is served), never silently.
    for (const row of s.skipped)
      log.warn(
        { scope: row.scope, key: row.key, reason: row.reason },
        'stored policy row does not validate: left out of the snapshot',
      );
    return s;
  }

  async #listen(dsn: string): Promise<void> {
    const client = new pg.Client({ connectionString: dsn });
    client.on('error', (err) =>
      this.#log.warn({ err }, 'policy store notifications lost; relying on the periodic reload'),
    );
    await client.connect();
    client.on('notification', () => void this.reload());
    await client.query(`LISTEN ${CHANGES_CHANNEL}`);
    this.#listener = client;
  }

  get value(): Snapshot {
    return this.#value;
  }

  /** Reads the store again (one read at a time; a notification during a read reads once more). */
  reload(): Promise<void> {
    this.#pending = this.#reload();
    return this.#pending;
  }

  #pending: Promise<void> | null = null;

  #reload = coalesced(
    async () => {
      try {
        this.#value = await StoreSnapshotSource.#load(this.#db, this.#enclaveId, this.#log);
        this.#onChange();
      } catch (err) {
        if (!this.#closed) this.#log.error({ err }, 'policy store reload failed; keeping the last good state');
      }
    },
    () => this.#closed,
  );

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    await this.#pending?.catch(() => {});
    await this.#listener?.end().catch(() => {});
    await this.#db.close();
  }
}
