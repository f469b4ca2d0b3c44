-- Account management and sign-in with an OpenID Provider.
--
-- An account is local (a password hash) or federated (issuer + subject, no password). The
-- `member` role may only act as agents: no admin page lets it in. A disabled account cannot
-- sign in, and its sessions stop at once (the session lookup joins on `disabled_at IS NULL`).

ALTER TABLE admin_users DROP CONSTRAINT admin_users_role_check;
ALTER TABLE admin_users ADD CONSTRAINT admin_users_role_check
    CHECK (role IN ('admin', 'auditor', 'viewer', 'member'));

-- Federated accounts have no password; NULL never verifies.
ALTER TABLE admin_users ALTER COLUMN password_hash DROP NOT NULL;
ALTER TABLE admin_users
    ADD COLUMN oidc_issuer   TEXT,
    ADD COLUMN oidc_subject  TEXT,
    ADD COLUMN disabled_at   TIMESTAMPTZ,
    ADD COLUMN last_sign_in_at TIMESTAMPTZ,
    ADD CONSTRAINT admin_users_oidc_identity_key UNIQUE (oidc_issuer, oidc_subject),
    ADD CONSTRAINT admin_users_oidc_pair CHECK ((oidc_issuer IS NULL) = (oidc_subject IS NULL));

-- Sessions get an id that can be shown and named in a URL (the token hash is the lookup key
-- and stays out of pages), and the time of their last use for the idle timeout.
ALTER TABLE admin_sessions
    ADD COLUMN id UUID NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD CONSTRAINT admin_sessions_id_key UNIQUE (id);

-- One-time password reset links: only the sha256 of the token is kept, for a short while.
CREATE TABLE admin_password_resets (
    token_sha256 TEXT PRIMARY KEY,
    user_id      UUID NOT NULL REFERENCES admin_users (id) ON DELETE CASCADE,
    created_by   TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX admin_password_resets_user_id_idx ON admin_password_resets (user_id);

-- Sign-ins in flight at the OpenID Provider: state (hashed), nonce and PKCE verifier, used
-- once by the callback, within minutes.
CREATE TABLE admin_sso_flows (
    state_sha256  TEXT PRIMARY KEY,
    nonce         TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    next_url      TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX admin_sso_flows_expires_at_idx ON admin_sso_flows (expires_at);
