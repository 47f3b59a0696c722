-- Org members (spec: memberView subject, username, email). Group memberships live in `memberships`.

CREATE TABLE IF NOT EXISTS members (
  org_id     text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  subject    text NOT NULL,
  username   text NOT NULL DEFAULT '',
  email      text NOT NULL DEFAULT '',
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, subject)
);
