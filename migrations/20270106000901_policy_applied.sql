-- What the last real `policy apply` wrote from the files: per agent, the agent itself
-- (kind 'agent', value ''), its grants and its users. Replaced in the apply's transaction.
-- A removal `apply` plans for something not listed here came from outside the files (the
-- admin UI or API) and is kept unless `--prune` is given.
CREATE TABLE policy_applied (
    agent      TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('agent', 'grant', 'user')),
    value      TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent, kind, value)
);
