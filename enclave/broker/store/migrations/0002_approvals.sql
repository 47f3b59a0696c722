-- The approval loop (enclave/broker/approvals/): tool calls llmproxy holds for a person's decision.

-- One row per held tool call. `status` moves once, from pending to approved, denied, expired or
-- cancelled; a pending row past `expires_at` is read as expired until the sweeper marks it. `arguments`
-- are the redacted arguments as llmproxy sent them (text). (agent_id, request_id, call_id) names the
-- held call: a create sent twice finds the first.
CREATE TABLE IF NOT EXISTS broker_approvals (
  id             text PRIMARY KEY,
  org_id         text NOT NULL,
  agent_id       text NOT NULL,
  agent_name     text NOT NULL,
  request_id     text NOT NULL,
  call_id        text NOT NULL,
  model          text NOT NULL,
  tool           text NOT NULL,
  arguments      text NOT NULL,
  args_digest    text NOT NULL,
  rule           text NOT NULL,
  summary        text NOT NULL,
  policy_version text NOT NULL,
  status         text NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired', 'cancelled')),
  reason         text,
  created_at     timestamptz NOT NULL,
  expires_at     timestamptz NOT NULL,
  decided_by     text,
  decided_at     timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS broker_approvals_call ON broker_approvals (agent_id, request_id, call_id);
-- The limits: pending per agent, pending per org, requests per agent in the last hour.
CREATE INDEX IF NOT EXISTS broker_approvals_pending_agent ON broker_approvals (agent_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS broker_approvals_pending_org ON broker_approvals (org_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS broker_approvals_agent_created ON broker_approvals (agent_id, created_at);
-- The sweeper's pending rows past their expiry, and the operators' listing (newest first).
CREATE INDEX IF NOT EXISTS broker_approvals_pending_expiry ON broker_approvals (expires_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS broker_approvals_org_created ON broker_approvals (org_id, created_at DESC, id DESC);

-- Every change of an approval, in commit order: the live feed (GET /api/v1/approvals/stream) sends them
-- with `id: seq`, and a client's Last-Event-ID resumes after its seq. `view` is the approvalView as of
-- the change. Changes append under one advisory lock held to their commit, so seq order is commit order
-- (a reader never sees seq N+1 before N). Kept 7 days.
CREATE TABLE IF NOT EXISTS broker_approval_events (
  seq         bigserial PRIMARY KEY,
  approval_id text NOT NULL,
  org_id      text NOT NULL,
  view        jsonb NOT NULL,
  at          timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS broker_approval_events_org ON broker_approval_events (org_id, seq);
CREATE INDEX IF NOT EXISTS broker_approval_events_at ON broker_approval_events (at);
