import { EventEmitter } from 'node:events';
import pg from 'pg';
import type { Queryable } from '../core/sql.ts';
import { CHANGES_CHANNEL } from '../pipeline/policy/store-snapshot.ts';

// Events to enclaves (spec: Events, facts 1–3): stored with an auto-incrementing cursor inside the
// change's own transaction, so an event exists exactly when its change committed. After the commit the
// publisher wakes the SSE handlers of this process; on PostgreSQL the transaction also NOTIFYs, and
// every replica LISTENing wakes its own handlers when it commits.

export interface EnclaveEvent {
  id: number;
  enclave_id: string;
  kind: string;
  payload: Record<string, unknown>;
}

export type ChangeTarget = { kind: 'platform' } | { kind: 'org'; org: string } | { kind: 'agent'; agent: string } | { kind: 'enclave'; enclave: string };

const CHANNEL = CHANGES_CHANNEL;

/** The enclaves a change concerns: every one for platform scope; an org's own and those running its agents; an agent's. */
export async function affectedEnclaves(db: Queryable, target: ChangeTarget): Promise<string[]> {
  const sql = {
    platform: ['SELECT id FROM enclaves ORDER BY id', []],
    org: [`SELECT id FROM enclaves WHERE owning_org_id = $1 UNION SELECT enclave_id FROM agents WHERE org_id = $1 AND enclave_id <> '' ORDER BY 1`, [(target as { org: string }).org]],
    agent: [`SELECT enclave_id AS id FROM agents WHERE uid = $1 AND enclave_id <> ''`, [(target as { agent: string }).agent]],
    enclave: ['SELECT id FROM enclaves WHERE id = $1', [(target as { enclave: string }).enclave]],
  }[target.kind] as [string, unknown[]];
  const { rows } = await db.query<{ id: string }>(sql[0], sql[1]);
  return rows.map((r) => r.id);
}

export class EventHub {
  #bus = new EventEmitter();
  #listener: pg.Client | null = null;

  constructor() {
    this.#bus.setMaxListeners(0);
  }

  /** On PostgreSQL, a dedicated connection LISTENs so other replicas' commits wake this one's handlers. */
  async listen(dsn: string): Promise<void> {
    if (!/^postgres(ql)?:\/\//.test(dsn)) return;
    const client = new pg.Client({ connectionString: dsn });
    client.on('error', () => {});
    await client.connect();
    client.on('notification', () => this.wake());
    await client.query(`LISTEN ${CHANNEL}`);
    this.#listener = client;
  }

  /** Stores one event per enclave inside the caller's transaction; true when at least one was stored. */
  async publish(tx: Queryable, enclaves: string[], kind: string, payload: Record<string, unknown>): Promise<boolean> {
    for (const enclave of enclaves) {
      await tx.query('INSERT INTO events (enclave_id, kind, payload) VALUES ($1, $2, $3)', [enclave, kind, JSON.stringify(payload)]);
    }
    // Always: a proxy reading the store directly (llmproxy --database-dsn) follows every change.
    await tx.query(`SELECT pg_notify('${CHANNEL}', '')`);
    return enclaves.length > 0;
  }

  /** Publishes to every enclave `target` concerns. */
  async publishTo(tx: Queryable, target: ChangeTarget, kind: string, payload: Record<string, unknown>): Promise<boolean> {
    return this.publish(tx, await affectedEnclaves(tx, target), kind, payload);
  }

  /** Called after a commit: every waiting handler of this process looks again. */
  wake(): void {
    this.#bus.emit('wake');
  }

  onWake(fn: () => void): () => void {
    this.#bus.on('wake', fn);
    return () => this.#bus.off('wake', fn);
  }

  async since(db: Queryable, enclave: string, cursor: number, limit = 500): Promise<EnclaveEvent[]> {
    const { rows } = await db.query<{ id: string | number; enclave_id: string; kind: string; payload: string }>(
      'SELECT id, enclave_id, kind, payload FROM events WHERE enclave_id = $1 AND id > $2 ORDER BY id LIMIT $3', [enclave, cursor, limit],
    );
    return rows.map((r) => ({ id: Number(r.id), enclave_id: r.enclave_id, kind: r.kind, payload: JSON.parse(r.payload) }));
  }

  /** The enclave resumed past `cursor`: everything up to it was delivered. */
  async consumed(db: Queryable, enclave: string, cursor: number): Promise<void> {
    await db.query('UPDATE events SET consumed_at = now() WHERE enclave_id = $1 AND id <= $2 AND consumed_at IS NULL', [enclave, cursor]);
  }

  /** The hourly purge: consumed events, and every event of an enclave that no longer exists. */
  async purge(db: Queryable): Promise<number> {
    const { rows } = await db.query<{ id: string }>(
      'DELETE FROM events WHERE consumed_at IS NOT NULL OR enclave_id NOT IN (SELECT id FROM enclaves) RETURNING id',
    );
    return rows.length;
  }

  async close(): Promise<void> {
    this.#bus.removeAllListeners();
    await this.#listener?.end().catch(() => {});
  }
}
