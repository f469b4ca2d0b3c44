-- Pinned tool groups: a tool of a pinned group is served only while its definition's content
-- hash is the one an admin approved; any other hash is held (hidden, uncallable) until approved.

-- NULL: groups.yaml says nothing (upstream groups are then pinned unless their spec says
-- `pin: false`; script groups are not).
ALTER TABLE tool_groups ADD COLUMN pin BOOLEAN;

-- The MCP definition each instance serves, so that pinning from the command line can approve
-- what the instances serve (upstream tools are not in the command line's own catalog).
ALTER TABLE tools ADD COLUMN definition JSONB;

-- The approved definition of each tool of a pinned group.
CREATE TABLE tool_approvals (
    name          TEXT PRIMARY KEY,
    group_name    TEXT NOT NULL,
    content_hash  TEXT NOT NULL,
    definition    JSONB NOT NULL,
    approved_by   TEXT NOT NULL,
    approved_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tool_approvals_group_name_idx ON tool_approvals (group_name);

-- Every instance rebuilds its snapshot when an approval changes, as for a grant.
CREATE TRIGGER tool_approvals_notify AFTER INSERT OR UPDATE OR DELETE ON tool_approvals
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();

-- Definitions seen in a pinned group that no admin approved yet (or that one rejected). One row
-- per tool and hash: instances racing to record the same change insert it once. No NOTIFY:
-- held-ness follows from the approvals alone, and an empty insert must not wake every instance.
CREATE TABLE tool_pending (
    name                 TEXT NOT NULL,
    content_hash         TEXT NOT NULL,
    group_name           TEXT NOT NULL,
    definition           JSONB NOT NULL,
    previous_hash        TEXT,
    previous_definition  JSONB,
    source               TEXT NOT NULL CHECK (source IN ('folder', 'upstream')),
    first_seen           TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    rejected_by          TEXT,
    rejected_at          TIMESTAMPTZ,
    PRIMARY KEY (name, content_hash)
);
CREATE INDEX tool_pending_group_name_idx ON tool_pending (group_name);
