import { EventEmitter } from 'node:events';
import pg from 'pg';
import type { Logger } from '../core/logger.ts';
import type { Counter } from '../core/metrics.ts';
import type { Queryable } from '../core/sql.ts';
import { CHANGES_CHANNEL } from '../pipeline/policy/store-snapshot.ts';
import { AUTHZ_CHANNEL } from './authz/capabilities.ts';

// Events to enclaves (spec: Events, facts 1–3): stored with an auto-incrementing cursor inside the
// change's own transaction, so an event exists exactly when its change committed. After the commit the
// publisher wakes the SSE handlers of this process; on PostgreSQL the transaction also NOTIFYs, and
// every replica LISTENing wakes its own handlers when it commits.
//
// The same LISTEN connection hears AUTHZ_CHANNEL: every committed change of any replica
// (authz/capabilities.ts, `announceGrantsChanged`), for `onAuthzChange` (the grant cache and the open
// streams' re-check, server.ts). A LISTEN connection that fails is logged, counted and reconnected with
// backoff (100 ms doubling to 30 s); once back, everything is told to look again, since a
// notification sent meanwhile was lost.

export interface EnclaveEvent {
  id: number;
  enclave_id: string;
  kind: string;
  payload: Record<string, unknown>;
}

export type ChangeTarget =
  | { kind: 'platform' }
  | { kind: 'org'; org: string }
  | { kind: 'agent'; agent: string }
  | { kind: 'enclave'; enclave: string };

const CHANNEL = CHANGES_CHANNEL;

/**
 * The enclaves a change concerns: every one for platform scope; an org's own and those running its agents; an agent's.
 */
export async function affectedEnclaves(db: Queryable, target: ChangeTarget): Promise<string[]> {
  const sql = {
    platform: ['SELECT id FROM enclaves ORDER BY id', []],
    org: [
      `SELECT id FROM enclaves WHERE owning_org_id = $1 UNION SELECT enclave_id FROM agents WHERE org_id = $1 AND enclave_id <> '' ORDER BY 1`,
      [(target as { org: string }).org],
    ],
    agent: [
      `SELECT enclave_id AS id FROM agents WHERE uid = $1 AND enclave_id <> ''`,
      [(target as { agent: string }).agent],
    ],
    enclave: ['SELECT id FROM enclaves WHERE id = $1', [(target as { enclave: string }).enclave]],
  }[target.kind] as [string, unknown[]];
  const { rows } = await db.query<{ id: string }>(sql[0], sql[1]);
  return rows.map((r) => r.id);
}

const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 30_000;

export interface ListenDeps {
  log: Logger;
  /** Failures of the LISTEN connection (label `connection: listen`). */
  failures: Counter<'connection'>;
}

export class EventHub {
  #bus = new EventEmitter();
  #listener: pg.Client | null = null;
  #closed = false;
  #retry: NodeJS.Timeout | null = null;
  #deps: ListenDeps | null = null;

  constructor() {
    this.#bus.setMaxListeners(0);
  }

  /**
   * On PostgreSQL, a dedicated connection LISTENs so other replicas' commits wake this one's handlers
   * and reach its authorization checks. The first connection must succeed (a bad DSN fails the start);
   * after that it is kept up.
   */
  async listen(dsn: string, deps: ListenDeps): Promise<void> {
    if (!/^postgres(ql)?:\/\//.test(dsn)) return;
    this.#deps = deps;
    await this.#connect(dsn, deps, RECONNECT_MIN_MS, true);
  }

  async #connect(dsn: string, deps: ListenDeps, backoff: number, first = false): Promise<void> {
    const client = new pg.Client({ connectionString: dsn });
    let lost = false;
    const reconnect = (err: Error) => {
      if (lost || this.#closed) return;
      lost = true;
      deps.failures.inc({ connection: 'listen' });
      deps.log.warn(
        { err, retry_ms: backoff },
        'the store LISTEN connection failed; reconnecting (changes of other replicas wait until then)',
      );
      if (this.#listener === client) this.#listener = null;
      client.end().catch(() => undefined); // already broken: its end has nothing to report
      this.#retry = setTimeout(() => {
        this.#retry = null;
        this.#connect(dsn, deps, Math.min(backoff * 2, RECONNECT_MAX_MS)).then(
          () => {
            deps.log.info('the store LISTEN connection is back');
            // Whatever was announced while it was down: look again.
            this.wake();
            this.#bus.emit('authz');
          },
          () => undefined,
        ); // the failed attempt scheduled the next one
      }, backoff);
      this.#retry.unref();
    };
    client.on('error', reconnect);
    client.on('end', () => reconnect(new Error('the LISTEN connection ended')));
    client.on('notification', (n) => (n.channel === AUTHZ_CHANNEL ? this.#bus.emit('authz') : this.wake()));
    try {
      await client.connect();
      await client.query(`LISTEN ${CHANNEL}`);
      await client.query(`LISTEN ${AUTHZ_CHANNEL}`);
    } catch (err) {
      if (first) {
        lost = true;
        await client.end().catch(() => undefined); // the connect error below says what went wrong
      } else reconnect(err as Error);
      throw err;
    }
    if (this.#closed) {
      await client.end();
      return;
    }
    this.#listener = client;
  }

  /** Calls `fn` when any replica committed a change (AUTHZ_CHANNEL), or the LISTEN connection came back. */
  onAuthzChange(fn: () => void): () => void {
    this.#bus.on('authz', fn);
    return () => this.#bus.off('authz', fn);
  }

  /** Stores one event per enclave inside the caller's transaction; true when at least one was stored. */
  async publish(tx: Queryable, enclaves: string[], kind: string, payload: Record<string, unknown>): Promise<boolean> {
    for (const enclave of enclaves) {
      await tx.query('INSERT INTO events (enclave_id, kind, payload) VALUES ($1, $2, $3)', [
        enclave,
        kind,
        JSON.stringify(payload),
      ]);
    }
    // Always: a proxy reading the store directly (llmproxy --database-dsn) follows every change.
    await tx.query(`SELECT pg_notify('${CHANNEL}', '')`);
    return enclaves.length > 0;
  }

  /** Publishes to every enclave `target` concerns. */
  async publishTo(
    tx: Queryable,
    target: ChangeTarget,
    kind: string,
    payload: Record<string, unknown>,
  ): Promise<boolean> {
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
      'SELECT id, enclave_id, kind, payload FROM events WHERE enclave_id = $1 AND id > $2 ORDER BY id LIMIT $3',
      [enclave, cursor, limit],
    );
    return rows.map((r) => ({
      id: Number(r.id),
      enclave_id: r.enclave_id,
      kind: r.kind,
      payload: JSON.parse(r.payload),
    }));
  }

  /** The enclave resumed past `cursor`: everything up to it was delivered. */
  async consumed(db: Queryable, enclave: string, cursor: number): Promise<void> {
    await db.query('UPDATE events SET consumed_at = now() WHERE enclave_id = $1 AND id <= $2 AND consumed_at IS NULL', [
      enclave,
      cursor,
    ]);
  }

  /** The hourly purge: consumed events, and every event of an enclave that no longer exists. */
  async purge(db: Queryable): Promise<number> {
    const { rows } = await db.query<{ id: string }>(
      'DELETE FROM events WHERE consumed_at IS NOT NULL OR enclave_id NOT IN (SELECT id FROM enclaves) RETURNING id',
    );
    return rows.length;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#retry) clearTimeout(this.#retry);
    this.#bus.removeAllListeners();
    const listener = this.#listener;
    this.#listener = null;
    await listener
      ?.end()
      .catch((err: Error) => this.#deps?.log.warn({ err }, 'closing the store LISTEN connection failed'));
  }
}
