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

/** Records durable before a flush were not all shipped to the store within its bound. */
export class AuditFlushTimeoutError extends Error {
  override name = 'AuditFlushTimeoutError';
  readonly code = 'DVX_AUDIT_FLUSH_TIMEOUT';
}

/** The record could not be made durable in time: the gated effect was refused (503 where HTTP). */
export class AuditUnavailableError extends Error {
  override name = 'AuditUnavailableError';
  readonly code = 'DVX_AUDIT_UNAVAILABLE';
}

// A store's insert fails one of two ways, and the shipper treats them oppositely: a store that is
// unavailable is retried with backoff (the batch waits in the WAL), a batch the store rejects is split
// down to the records it refuses, which go to the dead-letter spool. Each store classifies its own
// errors (stores/*.ts); the original error is kept as `cause`, so its stack and codes reach the log.

/** The store could not take the batch now (down, unreachable, timed out, overloaded): retry later. */
export class StoreUnavailableError extends Error {
  override name = 'StoreUnavailableError';
  readonly code: string = 'DVX_AUDIT_STORE_UNAVAILABLE';
  /** The store's own code (SQLSTATE, ClickHouse error code, errno) when it gave one. */
  readonly storeCode: string | undefined;
  constructor(message: string, storeCode: string | undefined, cause: unknown) {
    super(message, { cause });
    this.storeCode = storeCode;
  }
}

/** The store refused the data itself (a value its column type cannot hold): retrying changes nothing. */
export class StoreRejectedError extends Error {
  override name = 'StoreRejectedError';
  readonly code = 'DVX_AUDIT_STORE_REJECTED';
  readonly storeCode: string | undefined;
  constructor(message: string, storeCode: string | undefined, cause: unknown) {
    super(message, { cause });
    this.storeCode = storeCode;
  }
}

/**
 * The store refused every record of a batch probed one by one (P7.6): that is the store or its schema
 * (a column an operator changed), not the records, so the batch waits in the WAL and is retried like a
 * store that is down instead of being dead-lettered whole. `cause` is the store's rejection.
 */
export class StoreRefusesAllError extends StoreUnavailableError {
  override name = 'StoreRefusesAllError';
  override readonly code = 'DVX_AUDIT_STORE_REFUSES_ALL';
}

/** Another process holds the dead-letter spool (a `dvx wal dead-letter replay` in progress). */
export class DeadLetterBusyError extends Error {
  override name = 'DeadLetterBusyError';
  readonly code = 'DVX_DEAD_LETTER_BUSY';
}
