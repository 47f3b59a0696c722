-- dvx audit store, ClickHouse (HTTP interface; applied on start; idempotent). Written for the subset
-- that runs on ClickHouse 18.16 (Debian's package) and current releases: ReplacingMergeTree keyed on
-- the record id (retried batches collapse), DateTime plus a millisecond column (no DateTime64), string
-- maps as parallel key/value arrays (no Map type), JSON kept in String columns.
-- Statements are separated by lines holding only ";".

CREATE TABLE IF NOT EXISTS {db}.llm_audit_log (
  id                  String,
  event_time          DateTime,
  event_time_ms       UInt16,
  org_id              String,
  agent_id            String,
  agent_name          String,
  enclave_id          String,
  format              String,
  upstream_format     String,
  path                String,
  model               String,
  status              UInt16,
  upstream_status     Nullable(UInt16),
  latency_ms          Float64,
  upstream_latency_ms Nullable(Float64),
  overhead_ms         Nullable(Float64),
  request_bytes       UInt64,
  response_bytes      UInt64,
  input_tokens        Nullable(UInt64),
  output_tokens       Nullable(UInt64),
  decision            String,
  findings            String,
  inspection_failopen UInt8,
  inspection_failures String DEFAULT '[]',
  error               String
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
CREATE TABLE IF NOT EXISTS {db}.audit_events (
  id            String,
  event_time    DateTime,
  event_time_ms UInt16,
  kind          String,
  action        String,
  actor         String,
  actor_kind    String,
  agent_id      String,
  agent_name    String,
  attrs_keys    Array(String),
  attrs_values  Array(String),
  dst           String,
  dst_host      String,
  dst_ip        String,
  dst_port      Nullable(UInt16),
  enclave_id    String,
  enclave_name  String,
  group_id      String,
  identified    UInt8,
  namespace     String,
  org_id        String,
  outcome       String,
  proto         String,
  reason        String,
  resource      String,
  scope         String,
  security_id   String,
  session_id    String,
  source        String,
  src           String,
  src_ip        String,
  trace_id      String
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
-- The control-plane events of every org ordered by time, for a platform operator's reads (no org in
-- the predicate, so the base table's (org_id, …) key cannot help). Filled on insert; POPULATE copies
-- what the base table held when the view was first created.
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.audit_events_cp
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (event_time, id)
POPULATE AS SELECT * FROM {db}.audit_events WHERE kind = 'event'
;
-- One row per tool call llmproxy's tool-call policy decided; call_id is the call's llm_audit_log id.
CREATE TABLE IF NOT EXISTS {db}.tool_call_decisions (
  id             String,
  event_time     DateTime,
  event_time_ms  UInt16,
  call_id        String,
  org_id         String,
  agent_id       String,
  agent_name     String,
  enclave_id     String,
  model          String,
  tool           String,
  tool_call_id   String,
  args_digest    String,
  arguments      String,
  args_parsed    UInt8,
  rule           String,
  inspector      String,
  summary        String,
  verdict        String,
  outcome        String,
  reason         String,
  policy_version String,
  decided_by     String,
  decided_at     DateTime,
  decided_at_ms  UInt16,
  approval_id    String,
  held_ms        Float64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
