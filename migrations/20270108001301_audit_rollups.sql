-- Per-minute rollups of tool calls, for the charts: kept as rows are written by a follower
-- that reads the log in commit order from its own cursor (`internal:rollup` in
-- audit_sink_cursors), adding each batch and moving the cursor in one transaction, so every
-- row is counted once. Pages read these, never the log.
--
-- `latency_ms` counts results by latency bucket; the upper bounds (ms) are fixed in
-- src/audit/rollup.rs: 1 2 5 10 20 50 100 200 500 1000 2000 5000 10000 30000 and above.
CREATE TABLE audit_rollup_minute (
    minute      TIMESTAMPTZ NOT NULL,
    agent       TEXT NOT NULL,
    tool        TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    calls       BIGINT NOT NULL,
    latency_ms  BIGINT[] NOT NULL,
    PRIMARY KEY (minute, agent, tool, outcome)
);
CREATE INDEX audit_rollup_minute_agent_idx ON audit_rollup_minute (agent, minute);

-- What the charts read: the same counts per agent and for all agents (agent ''), per minute and
-- per hour, so a week's chart reads 168 rows per outcome, not the minutes of every agent and
-- tool.
CREATE TABLE audit_rollup_totals (
    granularity TEXT NOT NULL CHECK (granularity IN ('minute', 'hour')),
    start       TIMESTAMPTZ NOT NULL,
    agent       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    calls       BIGINT NOT NULL,
    latency_ms  BIGINT[] NOT NULL,
    PRIMARY KEY (granularity, agent, start, outcome)
);
