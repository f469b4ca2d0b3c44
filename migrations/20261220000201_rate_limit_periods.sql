-- Rate limits as written: a count (fractions allowed) per second, minute or hour, and a burst
-- that may be left to its default (NULL). Existing rows were whole requests per second.
ALTER TABLE rate_limits
    ADD COLUMN rate DOUBLE PRECISION,
    ADD COLUMN period TEXT NOT NULL DEFAULT 'second'
        CHECK (period IN ('second', 'minute', 'hour'));

-- The API used to accept any positive integer; beyond a million a second is no limit anyway.
UPDATE rate_limits SET rate = LEAST(per_second, 1000000), burst = LEAST(burst, 1000000);

-- NaN compares greater than every number in Postgres, so it is excluded by name; the bounds
-- are those the gateway checks (at most 1e6 per second, at least one a day).
ALTER TABLE rate_limits
    ALTER COLUMN rate SET NOT NULL,
    ALTER COLUMN period DROP DEFAULT,
    ALTER COLUMN burst DROP NOT NULL,
    ADD CONSTRAINT rate_limits_rate_check CHECK (
        rate <> 'NaN'
        AND rate > 0
        AND rate / CASE period WHEN 'second' THEN 1 WHEN 'minute' THEN 60 ELSE 3600 END <= 1000000
        AND CASE period WHEN 'second' THEN 1 WHEN 'minute' THEN 60 ELSE 3600 END / rate <= 86400
    ),
    ADD CONSTRAINT rate_limits_burst_max CHECK (burst IS NULL OR burst <= 1000000),
    DROP COLUMN per_second;
