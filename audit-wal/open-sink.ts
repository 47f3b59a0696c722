import type { Registry } from 'prom-client';
import type { Logger } from '../core/logger.ts';
import type { AuditOptions } from './options.ts';
import type { AuditSink, AuditTable } from './sink.ts';
import { StdoutAuditSink } from './stdout-sink.ts';
import { openStore, type AuditStore } from './store.ts';
import { WalSink } from './wal-sink.ts';

// A component's audit as its audit flags (options.ts) select it: the WAL under --audit-wal-dir shipped
// to --audit-dsn, or stdout lines with "stream":"audit". Every server (llmproxy, the gateway, imds, the
// broker, the control plane) opens it here, so they cannot drift apart.

export interface AuditSinkDeps {
  log: Logger;
  registry: Registry;
  /** The tables this component writes (the WAL opens only those). */
  tables: readonly AuditTable[];
  /** The store the component also reads (openAuditReadStore): the WAL ships to it and closes it. */
  store?: AuditStore | null;
}

export async function openAuditSink(options: AuditOptions, deps: AuditSinkDeps): Promise<AuditSink> {
  if (!options.auditDsn) return new StdoutAuditSink();
  return WalSink.open({
    dir: options.auditWalDir,
    dsn: options.auditDsn,
    maxBytes: options.auditWalMaxBytes,
    log: deps.log,
    registry: deps.registry,
    tables: deps.tables,
    ...(deps.store ? { store: deps.store } : {}),
  });
}

/**
 * The store --audit-dsn names, for a component that serves the audit read API over it (one instance,
 * which its WAL then ships to: pass it to openAuditSink), or null without --audit-dsn. A store that
 * does not answer at start is a warning, not a failed start: reads fail until it answers. A DSN that
 * names no store throws (DsnError).
 */
export async function openAuditReadStore(
  options: Pick<AuditOptions, 'auditDsn'>,
  log: Logger,
): Promise<AuditStore | null> {
  if (!options.auditDsn) return null;
  const store = await openStore(options.auditDsn);
  await store
    .ensureSchema()
    .catch((err: Error) => log.warn({ err }, 'audit store unreachable at start; reads fail until it answers'));
  return store;
}

/**
 * How an agent-path answer waits for its audit record (gate.ts): capture-or-deny applies only to a
 * durable sink, the WAL (`durable`: a test's own sink may say it is one); stdout lines are written at
 * once and never refuse.
 */
export function auditCapture(options: AuditOptions, durable = false): { captureOrDeny: boolean; timeoutMs: number } {
  return {
    captureOrDeny: (Boolean(options.auditDsn) || durable) && options.auditCaptureOrDeny,
    timeoutMs: options.auditCaptureTimeout,
  };
}
