-- A pending IdP undo is written before the IdP step, as an intent (controlplane/idp/pending-undo.ts):
-- the client's name identifies a registration interrupted before its client id was known (client_id
-- is '' until then), and a row is left to its request until retry_after (the grace), after which the
-- sweep at start and every grace/2 takes it. Rows written before this migration are retried at once.

ALTER TABLE idp_pending_undo ADD COLUMN IF NOT EXISTS client_name text NOT NULL DEFAULT '';

ALTER TABLE idp_pending_undo ADD COLUMN IF NOT EXISTS retry_after timestamptz NOT NULL DEFAULT now();
