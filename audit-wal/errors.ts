// The audit-wal error catalogue (STYLE.md rule 2): stable codes, one class each.

export class WalFullError extends Error {
  override name = 'WalFullError';
  readonly code = 'DVX_WAL_FULL';
}

export class WalWriteError extends Error {
  override name = 'WalWriteError';
  readonly code = 'DVX_WAL_WRITE';
}

export class WalClosedError extends Error {
  override name = 'WalClosedError';
  readonly code = 'DVX_WAL_CLOSED';
}

/** The record could not be made durable in time: the gated effect was refused (503 where HTTP). */
export class AuditUnavailableError extends Error {
  override name = 'AuditUnavailableError';
  readonly code = 'DVX_AUDIT_UNAVAILABLE';
}
