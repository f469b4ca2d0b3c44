-- Upstream MCP servers served as tool groups. The spec is validated by the application
-- (transport, command or URL, timeouts); secrets are never stored here, only the names of
-- the environment variables that hold them.
CREATE TABLE upstreams (
    name        TEXT PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9.-]([A-Za-z0-9_.-]*[A-Za-z0-9.-])?$' AND name NOT LIKE '%\_\_%'),
    spec        JSONB NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TRIGGER upstreams_notify AFTER INSERT OR UPDATE OR DELETE ON upstreams
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
