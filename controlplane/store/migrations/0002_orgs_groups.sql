-- Orgs and their groups (spec: createOrgReq / orgView, createGroupReq / groupView).

CREATE TABLE IF NOT EXISTS orgs (
  id               text PRIMARY KEY,
  kind             text NOT NULL DEFAULT 'customer',
  name             text NOT NULL,
  provider_org_ref text NOT NULL DEFAULT '',
  status           text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
  created_by       text NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS org_groups (
  org_id             text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  id                 text NOT NULL,
  name               text NOT NULL,
  provider_group_ref text NOT NULL DEFAULT '',
  created_by         text NOT NULL,
  created_at         timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, id)
);
