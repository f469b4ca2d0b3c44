-- Where each audit sink (`serve --audit-sink URL`) has delivered to, shared by every
-- instance: one instance at a time delivers a sink (it holds an advisory lock on the sink's name
-- while it sends),
-- from `after_id` (a row id, read in commit order: see 20270108001101), and moves it forward
-- only once the receiver has acknowledged the batch. Delivery is at least once.
CREATE TABLE audit_sink_cursors (
    sink        TEXT PRIMARY KEY,
    after_id    BIGINT NOT NULL DEFAULT 0,
    delivered   BIGINT NOT NULL DEFAULT 0,
    last_error  TEXT,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
