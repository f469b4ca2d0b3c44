-- State that must hold across every instance on this database (issue 11).

-- Client-assertion ids already used (RFC 7523 §3: a `jti` is accepted once). A row lives until
-- its assertion can no longer pass validation (exp plus clock leeway), then housekeeping
-- deletes it. Only assertions whose signature verified under a registered client's key get a
-- row, so strangers cannot grow the table; lengths are capped before any insert.
CREATE TABLE used_client_assertions (
    client_id  text        NOT NULL CHECK (length(client_id) <= 128),
    jti        text        NOT NULL CHECK (length(jti) <= 256),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (client_id, jti)
);
CREATE INDEX used_client_assertions_expires_at ON used_client_assertions (expires_at);

-- Admin sign-in throttling (GCRA): per key (`ip:<addr>` or `user:<name>`), the theoretical
-- arrival time of the next attempt. A key whose `tat` has passed is at its full burst again,
-- which is what a missing row means, so such rows are deleted.
CREATE TABLE admin_signin_throttle (
    key text        PRIMARY KEY CHECK (length(key) <= 80),
    tat timestamptz NOT NULL
);
CREATE INDEX admin_signin_throttle_tat ON admin_signin_throttle (tat);
