-- Keys of the control plane's own agent-operator token issuer (ES256), shared by every replica.

CREATE TABLE IF NOT EXISTS signing_keys (
  kid         text PRIMARY KEY,
  private_jwk text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
