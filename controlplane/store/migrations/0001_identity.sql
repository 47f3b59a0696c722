-- Identity and access: grants of roles or single capabilities to principals, custom roles, group
-- memberships. Principals are strings: user:<subject>, group:<org>:<group>, agent:<uid>.

CREATE TABLE IF NOT EXISTS roles (
  name         text PRIMARY KEY,
  org_id       text NOT NULL DEFAULT '',
  capabilities text[] NOT NULL,
  created_by   text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now()
);

-- grantView (spec): id int64, principal, role, capability, scope_kind, org_id, group_id, agent_id.
CREATE TABLE IF NOT EXISTS grants (
  id         bigserial PRIMARY KEY,
  principal  text NOT NULL,
  role       text,
  capability text,
  scope_kind text NOT NULL CHECK (scope_kind IN ('platform', 'org', 'group', 'agent')),
  org_id     text NOT NULL DEFAULT '',
  group_id   text NOT NULL DEFAULT '',
  agent_id   text NOT NULL DEFAULT '',
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  CHECK ((role IS NULL) <> (capability IS NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS grants_unique ON grants (principal, scope_kind, org_id, group_id, agent_id, coalesce(role, ''), coalesce(capability, ''));
CREATE INDEX IF NOT EXISTS grants_principal ON grants (principal);

CREATE TABLE IF NOT EXISTS memberships (
  org_id     text NOT NULL,
  group_id   text NOT NULL,
  subject    text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, group_id, subject)
);
CREATE INDEX IF NOT EXISTS memberships_subject ON memberships (subject);
