-- Dynamic Client Registration (RFC 7591) for interactive hosts (`mcp-remote`, desktop apps):
-- a host registers itself at /oauth/register. Such a client is `dynamic`; unless the server
-- runs with `--oauth-registration open` it is `held` until an admin approves it, and it
-- disappears at `expires_at` if by then it was never approved, or approved and never used.
ALTER TABLE oauth_public_clients
    ADD COLUMN registration TEXT NOT NULL DEFAULT 'admin'
        CHECK (registration IN ('admin', 'dynamic')),
    ADD COLUMN status TEXT NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'held')),
    -- The address the registration came from (as the request's origin resolved it).
    ADD COLUMN registered_from TEXT,
    ADD COLUMN approved_by TEXT,
    ADD COLUMN approved_at TIMESTAMPTZ,
    ADD COLUMN expires_at TIMESTAMPTZ,
    ADD CONSTRAINT oauth_public_clients_dynamic_expire
        CHECK (registration = 'admin' OR expires_at IS NOT NULL),
    ADD CONSTRAINT oauth_public_clients_admin_active
        CHECK (registration = 'dynamic' OR status = 'active');

CREATE INDEX oauth_public_clients_held_idx ON oauth_public_clients (status)
    WHERE status = 'held';
