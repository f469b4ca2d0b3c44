-- Charts per tool, and refusals by the grant or rule that refused them.
--
-- The totals gain a tool: rows keyed (agent, '') are per agent, ('', tool) per tool, ('', '') for
-- everything. Rows written before this keep tool '' and stay what they were.
ALTER TABLE audit_rollup_totals ADD COLUMN tool TEXT NOT NULL DEFAULT '';
ALTER TABLE audit_rollup_totals DROP CONSTRAINT audit_rollup_totals_pkey;
ALTER TABLE audit_rollup_totals ADD PRIMARY KEY (granularity, agent, tool, start, outcome);

-- Refusals per minute by agent, tool, reason (`not granted`, `argument rule`, `input schema`,
-- `rate limit`) and, for an argument rule, the rule (`<tool or group>.<parameter>`). The
-- per-minute agent × tool × outcome rows it replaces were read only for refusals.
CREATE TABLE audit_rollup_refusals (
    minute  TIMESTAMPTZ NOT NULL,
    agent   TEXT NOT NULL,
    tool    TEXT NOT NULL,
    reason  TEXT NOT NULL,
    rule    TEXT NOT NULL,
    calls   BIGINT NOT NULL,
    PRIMARY KEY (minute, agent, tool, reason, rule)
);
INSERT INTO audit_rollup_refusals (minute, agent, tool, reason, rule, calls)
SELECT minute, agent, tool,
       CASE outcome WHEN 'denied' THEN 'not granted' WHEN 'rate_limited' THEN 'rate limit'
                    ELSE 'input schema' END,
       '', calls
FROM audit_rollup_minute
WHERE outcome IN ('denied', 'rate_limited', 'invalid_arguments');
DROP TABLE audit_rollup_minute;
