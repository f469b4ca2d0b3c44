-- Local accounts of the admin UI and their sessions.
--
-- Passwords are argon2id PHC strings. A session is a random id held in the browser's cookie;
-- only its sha256 is stored, so a copy of this table cannot be replayed as a session.

CREATE TABLE admin_users (
    id            UUID PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE CHECK (username ~ '^[A-Za-z0-9_.@-]{1,64}$'),
    password_hash TEXT NOT NULL,
    -- admin edits everything; auditor reads everything and exports the audit log;
    -- viewer reads everything except tool arguments and results in the audit log.
    role          TEXT NOT NULL CHECK (role IN ('admin', 'auditor', 'viewer')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE admin_sessions (
    token_sha256  TEXT PRIMARY KEY,
    user_id       UUID NOT NULL REFERENCES admin_users (id) ON DELETE CASCADE,
    -- The per-session token every form of the UI must echo back.
    csrf_token    TEXT NOT NULL,
    remote_addr   TEXT,
    user_agent    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX admin_sessions_expires_at_idx ON admin_sessions (expires_at);
CREATE INDEX admin_sessions_user_id_idx ON admin_sessions (user_id);
