import { DEFAULT_CAPTURE_TIMEOUT_MS } from './gate.ts';

// The audit durability flags every component shares (spec: "Audit durability flags"), with their
// defaults and their one validation.

export interface AuditOptions {
  /** Columnar audit store (clickhouse://, postgres://, pglite://); empty keeps audit on stdout. */
  auditDsn: string;
  /** On-disk spool; required with auditDsn. */
  auditWalDir: string;
  /** Unshipped bytes per table; 0 selects the default (1 GiB). */
  auditWalMaxBytes: number;
  /** An authority-gated effect waits for its record to be durable. */
  auditCaptureOrDeny: boolean;
  auditCaptureTimeout: number;
}

export const AUDIT_DEFAULTS: AuditOptions = {
  auditDsn: '',
  auditWalDir: '',
  auditWalMaxBytes: 0,
  auditCaptureOrDeny: true,
  auditCaptureTimeout: DEFAULT_CAPTURE_TIMEOUT_MS,
};

/** What is wrong with the audit options, or null. */
export function auditOptionsProblem(o: AuditOptions): string | null {
  if (o.auditDsn && !o.auditWalDir)
    return '--audit-wal-dir is required with --audit-dsn (audit spools to disk before it ships)';
  if (o.auditWalDir && !o.auditDsn)
    return '--audit-wal-dir needs --audit-dsn: a spool nothing ships would only fill up';
  if (!(o.auditWalMaxBytes >= 0)) return '--audit-wal-max-bytes must be 0 (default) or a positive byte count';
  if (!(o.auditCaptureTimeout > 0)) return '--audit-capture-timeout must be positive';
  return null;
}
