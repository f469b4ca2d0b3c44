-- The tool catalog as loaded by the instances, shared with the admin UI and the grant checks.
CREATE TABLE tools (
    name          TEXT PRIMARY KEY,
    group_name    TEXT NOT NULL,
    title         TEXT,
    description   TEXT,
    input_schema  JSONB NOT NULL,
    content_hash  TEXT NOT NULL,
    source        TEXT NOT NULL CHECK (source IN ('script', 'upstream')),
    origin        TEXT NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tools_group_name_idx ON tools (group_name);
