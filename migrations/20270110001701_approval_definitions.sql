-- The tool definition each request for approval was made against, once per content hash: what
-- an approver reads, and what the next request's definition is compared with ("what changed
-- since a person last approved a call of this tool"). `last_approved_at` is set when a request
-- made against this definition is granted; the newest such row per tool is kept when requests
-- are purged, so the comparison outlives them.
CREATE TABLE approval_definitions (
    content_hash      TEXT PRIMARY KEY,
    tool              TEXT NOT NULL,
    definition        JSONB NOT NULL,
    first_seen        TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_approved_at  TIMESTAMPTZ
);
CREATE INDEX approval_definitions_tool_approved_idx
    ON approval_definitions (tool, last_approved_at DESC NULLS LAST);
