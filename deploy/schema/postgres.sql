-- dvx audit store, PostgreSQL and PGlite (applied on start; idempotent).
-- Rows are keyed by their hyperid id: a batch the shipper retries inserts nothing twice.

CREATE TABLE IF NOT EXISTS llm_audit_log (
  id                  text PRIMARY KEY,
  event_time          timestamptz NOT NULL,
  org_id              text NOT NULL DEFAULT '',
  agent_id            text NOT NULL DEFAULT '',
  agent_name          text NOT NULL DEFAULT '',
  enclave_id          text NOT NULL DEFAULT '',
  format              text,
  upstream_format     text,
  path                text NOT NULL DEFAULT '',
  model               text,
  status              integer NOT NULL DEFAULT 0,
  upstream_status     integer,
  latency_ms          double precision,
  upstream_latency_ms double precision,
  overhead_ms         double precision,
  request_bytes       bigint NOT NULL DEFAULT 0,
  response_bytes      bigint NOT NULL DEFAULT 0,
  input_tokens        bigint,
  output_tokens       bigint,
  decision            text NOT NULL DEFAULT 'allow',
  findings            jsonb NOT NULL DEFAULT '[]'::jsonb,
  inspection_failopen boolean NOT NULL DEFAULT false,
  inspection_failures jsonb NOT NULL DEFAULT '[]'::jsonb,
  error               text
);
-- Added after the first release: tables created before it gain the column.
ALTER TABLE llm_audit_log ADD COLUMN IF NOT EXISTS inspection_failures jsonb NOT NULL DEFAULT '[]'::jsonb;
CREATE INDEX IF NOT EXISTS llm_audit_log_org_time ON llm_audit_log (org_id, event_time);

CREATE TABLE IF NOT EXISTS audit_events (
  id           text PRIMARY KEY,
  event_time   timestamptz NOT NULL,
  kind         text NOT NULL DEFAULT 'event',
  action       text NOT NULL DEFAULT '',
  actor        text NOT NULL DEFAULT '',
  actor_kind   text NOT NULL DEFAULT '',
  agent_id     text NOT NULL DEFAULT '',
  agent_name   text NOT NULL DEFAULT '',
  attrs        jsonb NOT NULL DEFAULT '{}'::jsonb,
  dst          text NOT NULL DEFAULT '',
  dst_host     text NOT NULL DEFAULT '',
  dst_ip       text NOT NULL DEFAULT '',
  dst_port     integer,
  enclave_id   text NOT NULL DEFAULT '',
  enclave_name text NOT NULL DEFAULT '',
  group_id     text NOT NULL DEFAULT '',
  identified   boolean NOT NULL DEFAULT false,
  namespace    text NOT NULL DEFAULT '',
  org_id       text NOT NULL DEFAULT '',
  outcome      text NOT NULL DEFAULT '',
  proto        text NOT NULL DEFAULT '',
  reason       text NOT NULL DEFAULT '',
  resource     text NOT NULL DEFAULT '',
  scope        text NOT NULL DEFAULT '',
  security_id  text NOT NULL DEFAULT '',
  session_id   text NOT NULL DEFAULT '',
  source       text NOT NULL DEFAULT '',
  src          text NOT NULL DEFAULT '',
  src_ip       text NOT NULL DEFAULT '',
  trace_id     text NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_events_org_time ON audit_events (org_id, event_time);
-- Reads across every org (platform operators) and the tail's (event_time, id) cursor walk this one.
CREATE INDEX IF NOT EXISTS audit_events_time ON audit_events (event_time, id);

-- One row per tool call llmproxy's tool-call policy decided; call_id is the call's llm_audit_log id.
-- verdict is the policy's (allow, deny, require_approval), outcome what happened (allow, deny).
CREATE TABLE IF NOT EXISTS tool_call_decisions (
  id             text PRIMARY KEY,
  event_time     timestamptz NOT NULL,
  call_id        text NOT NULL DEFAULT '',
  org_id         text NOT NULL DEFAULT '',
  agent_id       text NOT NULL DEFAULT '',
  agent_name     text NOT NULL DEFAULT '',
  enclave_id     text NOT NULL DEFAULT '',
  model          text,
  tool           text NOT NULL DEFAULT '',
  tool_call_id   text NOT NULL DEFAULT '',
  args_digest    text NOT NULL DEFAULT '',
  arguments      text NOT NULL DEFAULT '',
  args_parsed    boolean NOT NULL DEFAULT false,
  rule           text,
  inspector      text,
  summary        text,
  verdict        text NOT NULL DEFAULT '',
  outcome        text NOT NULL DEFAULT '',
  reason         text NOT NULL DEFAULT '',
  policy_version text NOT NULL DEFAULT '',
  decided_by     text NOT NULL DEFAULT '',
  decided_at     timestamptz NOT NULL,
  approval_id    text,
  held_ms        double precision NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tool_call_decisions_org_time ON tool_call_decisions (org_id, event_time);
CREATE INDEX IF NOT EXISTS tool_call_decisions_call ON tool_call_decisions (call_id);
