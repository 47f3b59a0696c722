-- Service accounts (spec: serviceAccountView) and their keys, provisioned at the OIDC identity provider;
-- `id` is the client_id the IdP assigned, which is also the subject of the account's tokens.
-- IdP connectors of an org (spec: idpConnectorReq / idpConnectorView); client_secret is write-only.

CREATE TABLE IF NOT EXISTS service_accounts (
  id                        text PRIMARY KEY,
  org_id                    text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  name                      text NOT NULL,
  owner                     text NOT NULL,
  level                     text NOT NULL CHECK (level IN ('org', 'self-service')),
  status                    text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
  registration_client_uri   text NOT NULL,
  registration_access_token text NOT NULL,
  created_by                text NOT NULL,
  created_at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS service_accounts_org ON service_accounts (org_id);

CREATE TABLE IF NOT EXISTS service_account_keys (
  account_id text NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
  key_id     text NOT NULL,
  public_jwk text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, key_id)
);

CREATE TABLE IF NOT EXISTS idp_connectors (
  org_id           text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
  name             text NOT NULL,
  type             text NOT NULL CHECK (type IN ('oidc', 'saml')),
  issuer           text NOT NULL DEFAULT '',
  metadata_url     text NOT NULL DEFAULT '',
  client_id        text NOT NULL DEFAULT '',
  client_secret    text NOT NULL DEFAULT '',
  groups_attribute text NOT NULL DEFAULT '',
  scopes           text[] NOT NULL DEFAULT '{}',
  status           text NOT NULL DEFAULT 'active',
  created_by       text NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, name)
);
