import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import type { AuditSink, AuditTable } from '../../../audit-wal/sink.ts';
import { createLogger } from '../../../core/logger.ts';
import { openDb, type Db, type Queryable } from '../../../core/sql.ts';
import type { BrokerAgent } from '../../../enclave/broker/agents.ts';
import type { BrokerBus, BrokerDeps, Sealer } from '../../../enclave/broker/deps.ts';
import { BROKER_DEFAULTS, type BrokerOptions } from '../../../enclave/broker/options.ts';
import { AgentConfigLockedError } from '../../../enclave/errors.ts';
import type { AgentView } from '../../../enclave/broker/agent-routes.ts';
import { migrate } from '../../../enclave/broker/store/migrate.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';

// What the identity tests stand on: a migrated broker store (PGlite or PostgreSQL), an AES-GCM sealer,
// an audit sink that keeps its records, a log that keeps its lines, a clock the test moves, and a small
// AgentView over broker_secrets / broker_agent_config (the broker's own one is elsewhere).

export interface TestStore {
  kind: 'pglite' | 'postgres';
  dsn: string;
  db: Db;
  /** Another connection pool on the same store (another broker process), null on PGlite. */
  second(): Promise<Db | null>;
  close(): Promise<void>;
}

/** A fresh, migrated broker store; null for PostgreSQL when no server answers (the caller says so). */
export async function brokerStore(kind: 'pglite' | 'postgres'): Promise<TestStore | null> {
  let dsn: string;
  let cleanup: () => Promise<void>;
  if (kind === 'pglite') {
    const dir = await mkdtemp(join(tmpdir(), 'dvx-broker-id-'));
    dsn = `pglite://${dir}`;
    cleanup = () => rm(dir, { recursive: true, force: true });
  } else {
    const pg = await freshPgDatabase('dvx_broker_id');
    if (!pg) return null;
    dsn = pg.dsn;
    cleanup = pg.drop;
  }
  const db = await openDb(dsn);
  await migrate(db);
  const others: Db[] = [];
  return {
    kind,
    dsn,
    db,
    async second() {
      if (kind === 'pglite') return null;
      const other = await openDb(dsn);
      others.push(other);
      return other;
    },
    async close() {
      for (const o of others) await o.close();
      await db.close();
      await cleanup();
    },
  };
}

export function testSealer(): Sealer & { opened: number } {
  const key = randomBytes(32);
  const sealer = {
    opened: 0,
    async seal(plaintext: string) {
      const iv = randomBytes(12);
      const c = createCipheriv('aes-256-gcm', key, iv);
      const body = Buffer.concat([c.update(plaintext, 'utf8'), c.final()]);
      return `t1.${Buffer.concat([iv, c.getAuthTag(), body]).toString('base64url')}`;
    },
    async open(sealed: string) {
      sealer.opened++;
      const raw = Buffer.from(sealed.slice(3), 'base64url');
      const d = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12));
      d.setAuthTag(raw.subarray(12, 28));
      return Buffer.concat([d.update(raw.subarray(28)), d.final()]).toString('utf8');
    },
  };
  return sealer;
}

export class MemoryAudit implements AuditSink {
  records: Record<string, unknown>[] = [];
  /** When set, appends fail (capture-or-deny refuses the change). */
  failing = false;
  async append(_table: AuditTable, record: Record<string, unknown>): Promise<void> {
    if (this.failing) throw new Error('audit store down');
    this.records.push(record);
  }
  async flush(): Promise<void> {}
  async close(): Promise<void> {}
  actions(): string[] {
    return this.records.map((r) => `${r.action}:${r.outcome}`);
  }
}

export interface TestClock {
  now: () => number;
  set(ms: number): void;
  advance(ms: number): void;
}

export function testClock(start = Date.now()): TestClock {
  let t = start;
  return {
    now: () => t,
    set: (ms) => {
      t = ms;
    },
    advance: (ms) => {
      t += ms;
    },
  };
}

export interface TestDeps extends BrokerDeps {
  audit: MemoryAudit;
  /** Every log line written, as text (to check that no secret reached it). */
  logText(): string;
}

export function testDeps(
  db: Db,
  options: Partial<BrokerOptions> = {},
  clock: { now: () => number } = { now: Date.now },
  sealer: Sealer = testSealer(),
): TestDeps {
  const lines: string[] = [];
  const log = createLogger({
    level: 'debug',
    destination: new Writable({
      write(chunk, _enc, cb) {
        lines.push(String(chunk));
        cb();
      },
    }) as never,
  });
  const audit = new MemoryAudit();
  return {
    db,
    log,
    registry: new Registry(),
    options: { ...BROKER_DEFAULTS, tlsCert: 'x', tlsKey: 'x', publicUrl: 'https://broker.test:8450', ...options },
    enclave: { id: 'enc-1', name: 'eu-prod' },
    audit,
    capture: { captureOrDeny: true, timeoutMs: 2000, log },
    sealer,
    bus: new EventEmitter() as BrokerBus,
    now: clock.now,
    logText: () => lines.join(''),
  };
}

export async function addAgent(
  db: Queryable,
  a: Partial<BrokerAgent> & { uid: string; org_id: string },
): Promise<void> {
  await db.query(
    `INSERT INTO broker_agents (uid, org_id, group_id, name, status, contained, reason)
     VALUES ($1, $2, $3, $4, $5, $6, $7)`,
    [a.uid, a.org_id, a.group_id ?? null, a.name ?? a.uid, a.status ?? 'provisioning', a.contained ?? false, null],
  );
}

/**
 * A small AgentView for these tests: secrets from broker_secrets (org, then group, then agent), config
 * from broker_agent_config over a fixed base, `locked` keys refused.
 */
export function testAgentView(
  db: Queryable,
  sealer: Sealer,
  base: Record<string, unknown> = {},
  locked: string[] = [],
): AgentView {
  return {
    async secrets(agent) {
      const { rows } = await db.query<{ scope_kind: string; scope_id: string; name: string; sealed: string }>(
        `SELECT scope_kind, scope_id, name, sealed FROM broker_secrets
          WHERE org_id = $1 AND ((scope_kind = 'org' AND scope_id = $1) OR (scope_kind = 'group' AND scope_id = $2)
             OR (scope_kind = 'agent' AND scope_id = $3))`,
        [agent.org_id, agent.group_id ?? '', agent.uid],
      );
      const rank = { org: 0, group: 1, agent: 2 } as Record<string, number>;
      rows.sort((a, b) => rank[a.scope_kind] - rank[b.scope_kind]);
      const out: Record<string, string> = {};
      for (const r of rows) out[r.name] = await sealer.open(r.sealed);
      return out;
    },
    async config(agent) {
      const { rows } = await db.query<{ key: string; value: unknown }>(
        'SELECT key, value FROM broker_agent_config WHERE agent_uid = $1 ORDER BY key',
        [agent.uid],
      );
      const config: Record<string, unknown> = { ...base };
      for (const r of rows) config[r.key] = r.value;
      return { config, config_hash: `h${JSON.stringify(config).length}` };
    },
    async putConfig(tx, agent, key, value) {
      if (locked.includes(key)) throw new AgentConfigLockedError(`config key ${key} is locked above the agent`);
      await tx.query(
        `INSERT INTO broker_agent_config (agent_uid, key, value) VALUES ($1, $2, $3)
         ON CONFLICT (agent_uid, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()`,
        [agent.uid, key, JSON.stringify(value)],
      );
    },
  };
}

export async function putSecret(
  db: Queryable,
  sealer: Sealer,
  scope: 'org' | 'group' | 'agent',
  orgId: string,
  scopeId: string,
  name: string,
  value: string,
): Promise<void> {
  await db.query(
    `INSERT INTO broker_secrets (scope_kind, org_id, scope_id, name, sealed) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (scope_kind, org_id, scope_id, name) DO UPDATE SET sealed = EXCLUDED.sealed`,
    [scope, orgId, scopeId, name, await sealer.seal(value)],
  );
}
