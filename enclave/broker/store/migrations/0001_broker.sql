-- The enclave broker's own store (PGlite by default, PostgreSQL in production). Every table is
-- prefixed `broker_` so a broker pointed at a database another component uses can never touch its rows.

-- Small documents the broker keeps across restarts: the event cursor (`events_cursor`), the last good
-- snapshot (`snapshot`) and config (`config`) pulled from the control plane.
CREATE TABLE IF NOT EXISTS broker_state (
  key        text PRIMARY KEY,
  value      jsonb NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- The agents this enclave runs, as the broker knows them. `status` is the lifecycle status the broker
-- enforces (created, provisioning, active, suspended, isolated); `cp_status` the one the control plane
-- last showed; `contained` the control plane's containment flag.
CREATE TABLE IF NOT EXISTS broker_agents (
  uid        text PRIMARY KEY,
  org_id     text NOT NULL,
  group_id   text,
  name       text NOT NULL,
  status     text NOT NULL,
  cp_status  text,
  contained  boolean NOT NULL DEFAULT false,
  reason     text,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Single-use bootstrap tokens, stored as SHA-256 hashes only.
CREATE TABLE IF NOT EXISTS broker_bootstrap_tokens (
  token_hash text PRIMARY KEY,
  agent_uid  text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  used_at    timestamptz
);
CREATE INDEX IF NOT EXISTS broker_bootstrap_tokens_agent ON broker_bootstrap_tokens (agent_uid);

-- Refresh-token families: one per bootstrap; a replayed token revokes its whole family.
CREATE TABLE IF NOT EXISTS broker_token_families (
  family_id      text PRIMARY KEY,
  agent_uid      text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),
  revoked_at     timestamptz,
  revoked_reason text
);
CREATE INDEX IF NOT EXISTS broker_token_families_agent ON broker_token_families (agent_uid);

CREATE TABLE IF NOT EXISTS broker_refresh_tokens (
  token_hash text PRIMARY KEY,
  family_id  text NOT NULL REFERENCES broker_token_families (family_id) ON DELETE CASCADE,
  agent_uid  text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  used_at    timestamptz
);
CREATE INDEX IF NOT EXISTS broker_refresh_tokens_family ON broker_refresh_tokens (family_id);

-- ES256 signing keys of the platform JWT. The private JWK is sealed under the broker's data key.
CREATE TABLE IF NOT EXISTS broker_signing_keys (
  kid            text PRIMARY KEY,
  private_sealed text NOT NULL,
  public_jwk     jsonb NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),
  activates_at   timestamptz NOT NULL,
  retires_at     timestamptz
);

-- The broker's data keys, wrapped by the KMS (core/kms.ts); one is current.
CREATE TABLE IF NOT EXISTS broker_data_keys (
  id         text PRIMARY KEY,
  wrapped    text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Secret values, sealed. scope_kind org (scope_id = org id), group (scope_id = group id) or agent
-- (scope_id = agent uid).
CREATE TABLE IF NOT EXISTS broker_secrets (
  scope_kind text NOT NULL,
  org_id     text NOT NULL,
  scope_id   text NOT NULL,
  name       text NOT NULL,
  sealed     text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope_kind, org_id, scope_id, name)
);

-- A counter bumped by every secret write (the satellites' cache version).
CREATE TABLE IF NOT EXISTS broker_secrets_version (
  id      int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
  version bigint NOT NULL DEFAULT 0
);
INSERT INTO broker_secrets_version (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING;

-- Config values an agent wrote for itself (PUT /v1/agent/config/{key}).
CREATE TABLE IF NOT EXISTS broker_agent_config (
  agent_uid  text NOT NULL,
  key        text NOT NULL,
  value      jsonb NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (agent_uid, key)
);

-- Grants local to the enclave (operator listener): a role or a capability over an org.
CREATE TABLE IF NOT EXISTS broker_grants (
  id         bigserial PRIMARY KEY,
  principal  text NOT NULL,
  role       text,
  capability text,
  org_id     text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS broker_grants_unique
  ON broker_grants (principal, coalesce(role, ''), coalesce(capability, ''), org_id);

-- Status changes waiting to be reported to the control plane (kept while it is unreachable).
CREATE TABLE IF NOT EXISTS broker_status_outbox (
  agent_uid text PRIMARY KEY,
  status    text NOT NULL,
  reason    text,
  queued_at timestamptz NOT NULL DEFAULT now(),
  attempts  int NOT NULL DEFAULT 0
);
