// The audit sink: where components hand their audit records. Records go to stdout as
// `{"stream":"audit",…}` lines when no store is configured; the write-ahead log implements the
// same interface, and `append()` resolving means the record is as durable as the sink makes it.

/**
 * `llm_audit_log`: one row per LLM call; `audit_events`: the components' events;
 * `tool_call_decisions`: one row per tool call the tool-call policy decided (llmproxy), linked to its
 * call's `llm_audit_log` row by `call_id`; `network_flow`: one row per connection or request an agent
 * made through the gateway. `network_flow` is a spool of its own (a burst of flows never delays an
 * operator's event) whose records are stored as `audit_events` rows of kind `network_flow`
 * (rows.ts, STORE_TABLE), where the audit read API's `proto` and `dst_host` filters find them.
 */
export type AuditTable = 'llm_audit_log' | 'audit_events' | 'tool_call_decisions' | 'network_flow';

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
