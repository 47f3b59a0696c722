// The audit sink: where components hand their audit records. Records go to stdout as
// `{"stream":"audit",…}` lines when no store is configured; the write-ahead log implements the
// same interface, and `append()` resolving means the record is as durable as the sink makes it.

export type AuditTable = 'llm_audit_log' | 'audit_events';

export interface AuditSink {
  append(table: AuditTable, record: Record<string, unknown>): Promise<void>;
  /** Waits for every appended record to be written out (graceful shutdown). */
  flush(): Promise<void>;
  /**
   * Sinks that ship to a store: resolves once every record durable at the call is in the store (or
   * dead-lettered), throws past `timeoutMs`. Erasure waits for it before it sweeps the store.
   */
  shipped?(timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}
