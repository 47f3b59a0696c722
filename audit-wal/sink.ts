// The audit sink: where components hand their audit records. Records go to stdout as
// `{"stream":"audit",…}` lines when no store is configured; the write-ahead log implements the
// same interface, and `append()` resolving means the record is as durable as the sink makes it.

/**
 * `llm_audit_log`: one row per LLM call; `audit_events`: the components' events;
 * `tool_call_decisions`: one row per tool call the tool-call policy decided (llmproxy), linked to its
 * call's `llm_audit_log` row by `call_id`.
 */
export type AuditTable = 'llm_audit_log' | 'audit_events' | 'tool_call_decisions';

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
