-- Per-person OAuth to an upstream's authorization server ("connect" on My connections): the
-- stored value of such a slot is the token grant (access and refresh token), sealed like any
-- credential. `refresh_at` says when an instance should refresh it (ahead of expiry); NULL for
-- every other value and for a grant that cannot be refreshed. Instances take due rows with
-- FOR UPDATE SKIP LOCKED, so one refresh token is used by one instance once.
ALTER TABLE credentials ADD COLUMN refresh_at TIMESTAMPTZ;
CREATE INDEX credentials_refresh_at_idx ON credentials (refresh_at) WHERE refresh_at IS NOT NULL;

-- Connections sent to an authorization server, waiting for its callback: the PKCE verifier and
-- the endpoints discovered at the start, under the hash of `state`, for the account that
-- started it. A callback is accepted only from the browser that started it (which holds
-- `state` in a cookie of its own) and only once.
CREATE TABLE credential_connect_flows (
    state_sha256   TEXT PRIMARY KEY,
    username       TEXT NOT NULL,
    group_name     TEXT NOT NULL,
    name           TEXT NOT NULL,
    pkce_verifier  TEXT NOT NULL,
    token_endpoint TEXT NOT NULL,
    resource       TEXT NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX credential_connect_flows_expires_at_idx ON credential_connect_flows (expires_at);
