import type { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import type { CaptureOptions } from '../../audit-wal/gate.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import type { Logger } from '../../core/logger.ts';
import type { Db } from '../../core/sql.ts';
import type { BrokerOptions } from './options.ts';

// What every part of the broker is handed: its store, its log, its audit sink and capture posture, the
// sealer of its secrets, and the in-process bus that tells the parts about each other's changes.

/** Seals and opens values under the broker's current data key (sealer.ts). */
export interface Sealer {
  seal(plaintext: string): Promise<string>;
  open(sealed: string): Promise<string>;
}

/**
 * In-process change notifications: a secret was written (the new version), an agent's state changed, an
 * approval changed (its feed seq, id and org; approvals/feed.ts).
 */
export type BrokerBus = EventEmitter<{
  secrets: [version: number];
  agent: [uid: string];
  approvals: [change: { seq: number; id: string; orgId: string }];
}>;

export interface BrokerDeps {
  db: Db;
  log: Logger;
  registry: Registry;
  options: BrokerOptions;
  enclave: { id: string; name: string };
  audit: AuditSink;
  capture: CaptureOptions;
  sealer: Sealer;
  bus: BrokerBus;
  now: () => number;
}
