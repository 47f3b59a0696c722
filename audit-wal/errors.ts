import { coded } from '../core/errors.ts';

// The audit-wal error catalogue (docs/errors.md, "audit-wal"): one class per error, each a stable code.

/** A table's WAL holds its byte bound of unshipped records: the record is dropped (or refused). */
export class WalFullError extends coded('DVX_WAL_FULL') {}

/** A record could not be written: it exceeds the frame limit, or a write failed (the table is then unusable). */
export class WalWriteError extends coded('DVX_WAL_WRITE') {}

/** A record was appended after the WAL was closed (shutdown). */
export class WalClosedError extends coded('DVX_WAL_CLOSED') {}

/** Records durable before a flush were not all shipped to the store within its bound. */
export class AuditFlushTimeoutError extends coded('DVX_AUDIT_FLUSH_TIMEOUT') {}

/** The record could not be made durable in time: the gated effect was refused (503 where HTTP). */
export class AuditUnavailableError extends coded('DVX_AUDIT_UNAVAILABLE') {}

// A store's insert fails one of two ways, and the shipper treats them oppositely: a store that is
// unavailable is retried with backoff (the batch waits in the WAL), a batch the store rejects is split
// down to the records it refuses, which go to the dead-letter spool. Each store classifies its own
// errors (stores/*.ts); the original error is kept as `cause`, so its stack and codes reach the log.

/** The store could not take the batch now (down, unreachable, timed out, overloaded): retry later. */
export class StoreUnavailableError extends coded('DVX_AUDIT_STORE_UNAVAILABLE') {
  /** The store's own code (SQLSTATE, ClickHouse error code, errno) when it gave one. */
  readonly storeCode: string | undefined;
  constructor(message: string, storeCode: string | undefined, cause: unknown) {
    super(message, { cause });
    this.storeCode = storeCode;
  }
}

/** The store refused the data itself (a value its column type cannot hold): retrying changes nothing. */
export class StoreRejectedError extends coded('DVX_AUDIT_STORE_REJECTED') {
  readonly storeCode: string | undefined;
  constructor(message: string, storeCode: string | undefined, cause: unknown) {
    super(message, { cause });
    this.storeCode = storeCode;
  }
}

/**
 * The store refused every record of a batch probed one by one: that is the store or its schema (a
 * column an operator changed), not the records, so the batch waits in the WAL and is retried like a
 * store that is down instead of being dead-lettered whole. `cause` is the store's rejection.
 */
export class StoreRefusesAllError extends StoreUnavailableError {
  static override readonly code = 'DVX_AUDIT_STORE_REFUSES_ALL';
}

/** Another live process (or this one) holds a WAL directory's lock: one writer per spool. */
export class WalDirBusyError extends coded('DVX_WAL_DIR_BUSY') {}

/** Another process holds the dead-letter spool (a `dvx wal dead-letter replay` in progress). */
export class DeadLetterBusyError extends coded('DVX_DEAD_LETTER_BUSY') {}

/** An audit query parameter (a filter, a time bound, a limit, a cursor) is not valid; `field` names it. */
export class AuditQueryError extends coded('DVX_AUDIT_QUERY_INVALID') {
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field}: ${message}`);
    this.field = field;
  }
}

/** `--audit-dsn` is not a URL or names a store dvx does not have. */
export class DsnError extends coded('DVX_AUDIT_DSN_INVALID') {}
