-- An IdP step the control plane must undo (a client registered for a service account whose store
-- change then failed: `remove`; a key set changed at the IdP whose store change failed: `update`),
-- written before the undo is attempted and deleted once it succeeds. What is left here failed, was
-- logged, counted and audited, and is attempted again at every start (controlplane/idp/pending-undo.ts).
-- The registration access token is the same secret service_accounts keeps for a live account.

CREATE TABLE IF NOT EXISTS idp_pending_undo (
  id                        bigserial PRIMARY KEY,
  step                      text NOT NULL CHECK (step IN ('remove', 'update')),
  org_id                    text NOT NULL,
  client_id                 text NOT NULL,
  registration_client_uri   text NOT NULL,
  registration_access_token text NOT NULL,
  cause                     text NOT NULL,
  last_error                text NOT NULL DEFAULT '',
  attempts                  integer NOT NULL DEFAULT 0,
  created_at                timestamptz NOT NULL DEFAULT now()
)
