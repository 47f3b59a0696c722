-- Per-org data keys, wrapped by the KMS (NULL once shredded), and per-org erasures (restart-safe:
-- a sweep still `running` at start is resumed).

CREATE TABLE IF NOT EXISTS org_keys (
  org_id      text PRIMARY KEY,
  wrapped     text,
  provider    text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL DEFAULT now(),
  shredded_at timestamptz
);

CREATE TABLE IF NOT EXISTS erasures (
  org_id       text PRIMARY KEY,
  status       text NOT NULL CHECK (status IN ('running', 'complete')),
  key_shredded boolean NOT NULL DEFAULT false,
  rows_swept   bigint NOT NULL DEFAULT 0,
  requested_by text NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz
);
