-- Agents, the tool groups' metadata, grants, OAuth clients, signing keys and revoked tokens.

CREATE TABLE agents (
    id            UUID PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    description   TEXT NOT NULL DEFAULT '',
    notes         TEXT NOT NULL DEFAULT '',
    discovery     TEXT NOT NULL DEFAULT 'full' CHECK (discovery IN ('full', 'search', 'auto')),
    pinned        TEXT[] NOT NULL DEFAULT '{}',
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Metadata for tool groups (policies/groups.yaml); a group's tools come from the pool.
CREATE TABLE tool_groups (
    name          TEXT PRIMARY KEY,
    description   TEXT NOT NULL DEFAULT '',
    owner         TEXT NOT NULL DEFAULT '',
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A grant is a group name (every `<group>__*` tool) or one exact tool name.
CREATE TABLE agent_grants (
    id            UUID PRIMARY KEY,
    agent_id      UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    target        TEXT NOT NULL CHECK (target ~ '^[A-Za-z0-9_.-]{1,64}$'),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by    TEXT NOT NULL DEFAULT '',
    UNIQUE (agent_id, target)
);

-- Requests per second with a burst, for the agent as a whole (pattern NULL) or per group/tool.
CREATE TABLE rate_limits (
    id            UUID PRIMARY KEY,
    agent_id      UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    pattern       TEXT CHECK (pattern IS NULL OR pattern ~ '^[A-Za-z0-9_.-]{1,64}$'),
    per_second    INTEGER NOT NULL CHECK (per_second > 0),
    burst         INTEGER NOT NULL CHECK (burst > 0),
    UNIQUE NULLS NOT DISTINCT (agent_id, pattern)
);

CREATE TABLE oauth_clients (
    client_id     TEXT PRIMARY KEY,
    agent_id      UUID NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    -- argon2 PHC string; NULL for clients that authenticate with private_key_jwt only.
    secret_hash   TEXT,
    -- Public keys (a JWK set) for private_key_jwt.
    jwks          JSONB,
    description   TEXT NOT NULL DEFAULT '',
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (secret_hash IS NOT NULL OR jwks IS NOT NULL)
);

-- Ed25519 token signing keys. The newest unretired key signs; JWKS publishes it and the one before.
CREATE TABLE signing_keys (
    kid           TEXT PRIMARY KEY,
    algorithm     TEXT NOT NULL CHECK (algorithm = 'EdDSA'),
    private_pkcs8 BYTEA NOT NULL,
    public_key    BYTEA NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    retired_at    TIMESTAMPTZ
);

CREATE TABLE revoked_tokens (
    jti           UUID PRIMARY KEY,
    expires_at    TIMESTAMPTZ NOT NULL,
    revoked_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_by    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX revoked_tokens_expires_at_idx ON revoked_tokens (expires_at);

-- Every instance rebuilds its policy snapshot when this channel fires.
CREATE FUNCTION toolgate_notify_policy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolgate_policy', TG_TABLE_NAME);
    RETURN NULL;
END $$;

CREATE TRIGGER agents_notify AFTER INSERT OR UPDATE OR DELETE ON agents
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER agent_grants_notify AFTER INSERT OR UPDATE OR DELETE ON agent_grants
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER rate_limits_notify AFTER INSERT OR UPDATE OR DELETE ON rate_limits
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER oauth_clients_notify AFTER INSERT OR UPDATE OR DELETE ON oauth_clients
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER signing_keys_notify AFTER INSERT OR UPDATE OR DELETE ON signing_keys
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER revoked_tokens_notify AFTER INSERT OR UPDATE OR DELETE ON revoked_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
CREATE TRIGGER tool_groups_notify AFTER INSERT OR UPDATE OR DELETE ON tool_groups
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
