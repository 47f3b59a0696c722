-- dvx audit store, ClickHouse cluster variant: each table of clickhouse.sql as a
-- ReplicatedReplacingMergeTree table per shard (<name>_local, replicated through ClickHouse Keeper or
-- ZooKeeper) under a Distributed table with the name the audit shipper inserts into and the operator API
-- reads from (llm_audit_log, audit_events, audit_events_cp, tool_call_decisions). Same columns, keys and
-- partitions as clickhouse.sql (test/deploy/clickhouse-cluster.test.ts compares them).
--
-- Apply it once, before the first dvx component starts, with {db} and {cluster} replaced (the
-- {shard} and {replica} macros stay: each server's <macros> fill them):
--   sed -e 's/{db}/dvx/g' -e 's/{cluster}/dvx_cluster/g' deploy/schema/clickhouse-cluster.sql \
--     | clickhouse-client --multiquery
-- The components then find every table present (clickhouse.sql's CREATE ... IF NOT EXISTS does nothing).
--
-- Sharding key: cityHash64(org_id). A retried batch carries the same ids, and ReplacingMergeTree only
-- collapses copies on one shard, so a record must always land on the same shard: a random key would keep
-- the duplicates. One org per shard also keeps an org's reads and its erasure on one shard.
-- Erasure (DELETE /api/v1/orgs/{org}/audit) mutates the tables by name; on a cluster run it on the local
-- tables ON CLUSTER instead (docs/operations.md, "ClickHouse cluster").
-- Statements are separated by lines holding only ";".

CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER {cluster}
;

CREATE TABLE IF NOT EXISTS {db}.llm_audit_log_local ON CLUSTER {cluster} (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/llm_audit_log_local', '{replica}')
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
CREATE TABLE IF NOT EXISTS {db}.llm_audit_log ON CLUSTER {cluster} AS {db}.llm_audit_log_local
ENGINE = Distributed({cluster}, {db}, llm_audit_log_local, cityHash64(org_id))
;

CREATE TABLE IF NOT EXISTS {db}.audit_events_local ON CLUSTER {cluster} (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/audit_events_local', '{replica}')
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
CREATE TABLE IF NOT EXISTS {db}.audit_events ON CLUSTER {cluster} AS {db}.audit_events_local
ENGINE = Distributed({cluster}, {db}, audit_events_local, cityHash64(org_id))
;

-- The control-plane events of every org ordered by time (clickhouse.sql's audit_events_cp view): a
-- replicated table per shard filled by a materialized view on that shard's audit_events_local, read
-- through a Distributed table of the view's name.
CREATE TABLE IF NOT EXISTS {db}.audit_events_cp_local ON CLUSTER {cluster} (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/audit_events_cp_local', '{replica}')
PARTITION BY toYYYYMM(event_time)
ORDER BY (event_time, id)
;
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.audit_events_cp_mv ON CLUSTER {cluster} TO {db}.audit_events_cp_local
AS SELECT * FROM {db}.audit_events_local WHERE kind = 'event'
;
CREATE TABLE IF NOT EXISTS {db}.audit_events_cp ON CLUSTER {cluster} AS {db}.audit_events_cp_local
ENGINE = Distributed({cluster}, {db}, audit_events_cp_local, cityHash64(org_id))
;

-- One row per tool call llmproxy's tool-call policy decided; call_id is the call's llm_audit_log id.
CREATE TABLE IF NOT EXISTS {db}.tool_call_decisions_local ON CLUSTER {cluster} (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/tool_call_decisions_local', '{replica}')
PARTITION BY toYYYYMM(event_time)
ORDER BY (org_id, event_time, id)
;
CREATE TABLE IF NOT EXISTS {db}.tool_call_decisions ON CLUSTER {cluster} AS {db}.tool_call_decisions_local
ENGINE = Distributed({cluster}, {db}, tool_call_decisions_local, cityHash64(org_id))
;
