-- Desired state enclaves converge on: LLM policy and settings (service_config / agent_config, as the
-- spec names them), config values, org feature flags, enclaves, agents, and the events that carry
-- each change to the enclaves it concerns.

-- Platform, org and group rows of a service's keys (service `llmproxy`: the policy keys and settings).
-- `value` is the JSON text of the value.
CREATE TABLE IF NOT EXISTS service_config (
  service    text NOT NULL,
  scope_kind text NOT NULL CHECK (scope_kind IN ('platform', 'org', 'group')),
  org_id     text NOT NULL DEFAULT '',
  group_id   text NOT NULL DEFAULT '',
  key        text NOT NULL,
  value      text NOT NULL,
  locked     boolean NOT NULL DEFAULT false,
  updated_by text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (service, scope_kind, org_id, group_id, key)
);

-- Agent overrides of a service's keys; never locked.
CREATE TABLE IF NOT EXISTS agent_config (
  override_service text NOT NULL,
  agent_id         text NOT NULL,
  org_id           text NOT NULL,
  key              text NOT NULL,
  value            text NOT NULL,
  updated_by       text NOT NULL,
  updated_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (override_service, agent_id, key)
);

-- Config values (spec: configValueReq) at platform, org, group or agent scope. A secret key stores no
-- value here: the bytes are authored enclave-side.
CREATE TABLE IF NOT EXISTS config_values (
  scope_kind text NOT NULL CHECK (scope_kind IN ('platform', 'org', 'group', 'agent')),
  org_id     text NOT NULL DEFAULT '',
  group_id   text NOT NULL DEFAULT '',
  agent_id   text NOT NULL DEFAULT '',
  key        text NOT NULL,
  value      text,
  locked     boolean NOT NULL DEFAULT false,
  secret     boolean NOT NULL DEFAULT false,
  updated_by text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope_kind, org_id, group_id, agent_id, key)
);

CREATE TABLE IF NOT EXISTS feature_flags (
  org_id     text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  flag       text NOT NULL,
  enabled    boolean NOT NULL,
  updated_by text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, flag)
);

CREATE TABLE IF NOT EXISTS enclaves (
  id                 text PRIMARY KEY,
  name               text NOT NULL UNIQUE,
  owning_org_id      text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  status             text NOT NULL DEFAULT 'registered',
  isolation_class    text NOT NULL DEFAULT 'plain' CHECK (isolation_class IN ('plain', 'vm', 'node-cvm', 'per-agent-tee')),
  broker_url         text NOT NULL DEFAULT '',
  relay_url          text NOT NULL DEFAULT '',
  address_source     text NOT NULL DEFAULT '',
  address_updated_at timestamptz,
  broker_key_hash    text NOT NULL UNIQUE,
  created_by         text NOT NULL,
  created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS agents (
  uid          text PRIMARY KEY,
  org_id       text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  name         text NOT NULL,
  image        text NOT NULL DEFAULT '',
  command      text[] NOT NULL DEFAULT '{}',
  enclave_id   text NOT NULL DEFAULT '',
  group_id     text NOT NULL DEFAULT '',
  status       text NOT NULL DEFAULT 'created' CHECK (status IN ('created', 'provisioning', 'active', 'suspended', 'isolated')),
  contained    boolean NOT NULL DEFAULT false,
  policy_packs text[] NOT NULL DEFAULT '{}',
  created_by   text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS agents_org ON agents (org_id);
CREATE INDEX IF NOT EXISTS agents_enclave ON agents (enclave_id);

-- Events to enclaves, with an auto-incrementing cursor (SSE id). `consumed_at` is set when the enclave
-- resumes past it; consumed events and those of deleted enclaves are purged hourly.
CREATE TABLE IF NOT EXISTS events (
  id          bigserial PRIMARY KEY,
  enclave_id  text NOT NULL,
  kind        text NOT NULL,
  payload     text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  consumed_at timestamptz
);
CREATE INDEX IF NOT EXISTS events_enclave ON events (enclave_id, id);
