-- Governance policy per scope (llm, destination, exec, ssh, tunnel, tunnel_ports) and destination
-- packs defined once and installed at scopes; composed at read time by pipeline/policy/governance.ts.

CREATE TABLE IF NOT EXISTS governance_policy (
  kind       text NOT NULL CHECK (kind IN ('llm', 'destination', 'exec', 'ssh', 'tunnel', 'tunnel_ports')),
  scope_kind text NOT NULL CHECK (scope_kind IN ('platform', 'org', 'group', 'agent')),
  org_id     text NOT NULL DEFAULT '',
  group_id   text NOT NULL DEFAULT '',
  agent_id   text NOT NULL DEFAULT '',
  value      text NOT NULL,
  locked     boolean NOT NULL DEFAULT false,
  updated_by text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, scope_kind, org_id, group_id, agent_id)
);

CREATE TABLE IF NOT EXISTS policy_packs (
  name       text PRIMARY KEY,
  allow      text NOT NULL,
  deny       text NOT NULL,
  created_by text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS pack_installs (
  pack         text NOT NULL REFERENCES policy_packs (name) ON DELETE CASCADE,
  scope_kind   text NOT NULL CHECK (scope_kind IN ('platform', 'org', 'group', 'agent')),
  org_id       text NOT NULL DEFAULT '',
  group_id     text NOT NULL DEFAULT '',
  agent_id     text NOT NULL DEFAULT '',
  installed_by text NOT NULL,
  installed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (pack, scope_kind, org_id, group_id, agent_id)
);
