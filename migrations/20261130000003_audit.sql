-- The audit log: append-only, partitioned by month so that retention drops whole partitions.
--
-- Rows form hash chains: each writer (one per running instance, plus `control-plane` for
-- admin changes written inside their own transactions) numbers its rows with `chain_seq`
-- and stores sha256(prev_hash || canonical row) in `hash`. JSON payloads are stored as text
-- so that the hashed bytes are exactly the stored bytes.
CREATE SEQUENCE audit_events_id_seq;

CREATE TABLE audit_events (
    id            BIGINT NOT NULL DEFAULT nextval('audit_events_id_seq'),
    at            TIMESTAMPTZ NOT NULL,
    chain         TEXT NOT NULL,
    chain_seq     BIGINT NOT NULL,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    outcome       TEXT NOT NULL,
    agent         TEXT,
    client_id     TEXT,
    jti           TEXT,
    admin_user    TEXT,
    tool          TEXT,
    resource      TEXT,
    remote_addr   TEXT,
    user_agent    TEXT,
    request_id    TEXT,
    instance      TEXT NOT NULL,
    call_id       TEXT,
    exit_code     INTEGER,
    error         TEXT,
    latency_us    BIGINT,
    bytes_in      BIGINT,
    bytes_out     BIGINT,
    arguments     TEXT,
    result_sha256 TEXT,
    result        TEXT,
    details       TEXT,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);

CREATE INDEX audit_events_at_idx ON audit_events (at);
CREATE INDEX audit_events_agent_idx ON audit_events (agent, at);
CREATE INDEX audit_events_chain_idx ON audit_events (chain, chain_seq);

-- Nothing may change a row once written. (A superuser can still bypass this; the hash
-- chain is what makes such an edit visible.)
CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only';
END $$;

CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();

CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
