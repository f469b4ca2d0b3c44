-- Interactive hosts (desktop apps, IDEs, the MCP Inspector) sign a person in and act as one
-- of the agents that person may act as (authorization code + PKCE, RFC 6749 / 7636).

-- Who may act as an agent through an interactive host. Usernames are not a foreign key:
-- `agent.md` may name an account before it exists, and the mapping round-trips through
-- `policy export`/`apply` whether the account exists or not.
CREATE TABLE agent_users (
    agent_id      UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    username      TEXT NOT NULL CHECK (username ~ '^[A-Za-z0-9_.@-]{1,64}$'),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, username)
);

-- Public clients an admin registered by hand (hosts that cannot publish a Client ID
-- Metadata Document). They authenticate with nothing but PKCE.
CREATE TABLE oauth_public_clients (
    client_id     TEXT PRIMARY KEY CHECK (client_id ~ '^[A-Za-z0-9_.:-]{1,128}$'),
    client_name   TEXT NOT NULL CHECK (length(client_name) BETWEEN 1 AND 200),
    redirect_uris TEXT[] NOT NULL CHECK (cardinality(redirect_uris) BETWEEN 1 AND 20),
    created_by    TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One consent: a person let a host act as an agent. Every token issued from it (access and
-- refresh) dies with it. `expires_at` follows the newest refresh token.
CREATE TABLE oauth_authorizations (
    id            UUID PRIMARY KEY,
    client_id     TEXT NOT NULL,
    client_name   TEXT NOT NULL,
    agent_id      UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    username      TEXT NOT NULL,
    scope         TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    revoked_at    TIMESTAMPTZ,
    revoked_by    TEXT,
    revoked_reason TEXT
);
CREATE INDEX oauth_authorizations_username_idx ON oauth_authorizations (username);

-- Authorization codes: stored as sha256 only, single use, 60 s.
CREATE TABLE oauth_codes (
    code_hash        TEXT PRIMARY KEY,
    authorization_id UUID NOT NULL REFERENCES oauth_authorizations (id) ON DELETE CASCADE,
    client_id        TEXT NOT NULL,
    redirect_uri     TEXT NOT NULL,
    code_challenge   TEXT NOT NULL,
    resource         TEXT NOT NULL,
    expires_at       TIMESTAMPTZ NOT NULL,
    used_at          TIMESTAMPTZ
);
CREATE INDEX oauth_codes_expires_at_idx ON oauth_codes (expires_at);

-- Refresh tokens: sha256 only, rotated on every use; a used one presented again revokes
-- its authorization (the whole family).
CREATE TABLE oauth_refresh_tokens (
    token_hash       TEXT PRIMARY KEY,
    authorization_id UUID NOT NULL REFERENCES oauth_authorizations (id) ON DELETE CASCADE,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at       TIMESTAMPTZ NOT NULL,
    used_at          TIMESTAMPTZ
);
CREATE INDEX oauth_refresh_tokens_authorization_idx ON oauth_refresh_tokens (authorization_id);

-- The snapshot holds the live authorizations (tokens are checked against it on every
-- request) and who may act as whom. A refresh moving `expires_at` on is not a change the
-- snapshot needs at once, so it does not wake every instance.
CREATE TRIGGER agent_users_notify AFTER INSERT OR UPDATE OR DELETE ON agent_users
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER oauth_authorizations_notify AFTER INSERT OR DELETE OR UPDATE OF revoked_at ON oauth_authorizations
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();

-- The person behind a token obtained through an interactive host (its `act` claim). The
-- hash chain covers it when present; rows without it keep their hashes.
ALTER TABLE audit_events ADD COLUMN person TEXT;
