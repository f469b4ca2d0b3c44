-- Argument rules: an agent's grant narrowed per parameter (issue 14). One row per agent and
-- tool-or-group target; `params` maps a parameter name to a JSON Schema fragment of narrowing
-- keywords, checked by the application before it is written.
CREATE TABLE agent_argument_rules (
    agent_id    UUID        NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    target      TEXT        NOT NULL CHECK (target ~ '^[A-Za-z0-9_.-]{1,64}$'),
    params      JSONB       NOT NULL CHECK (jsonb_typeof(params) = 'object'),
    created_by  TEXT        NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, target)
);

CREATE TRIGGER agent_argument_rules_notify AFTER INSERT OR UPDATE OR DELETE ON agent_argument_rules
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
