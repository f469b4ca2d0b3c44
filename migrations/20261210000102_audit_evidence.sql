-- What the audit log must contain, kept where the serving role cannot rewrite it, so that
-- `toolgate audit verify` can tell a complete log from an emptied one.
--
-- * TRUNCATE is refused on the table and on every partition (partitions get the trigger
--   when `audit_ensure_partition` creates them).
-- * `audit_chain_heads` keeps each chain's first and last seq, last hash and row count,
--   maintained by a statement trigger (one upsert per insert statement, not per row).
-- * `audit_retention_ledger` records every partition retention dropped: when, by whom,
--   and which rows of which chain went with it.
-- * `audit_checkpoints` holds signed snapshots of the heads; the key is never here.
--
-- Functions that the serving role needs to run with the owner's rights are SECURITY
-- DEFINER with a fixed search_path, and executable only by roles granted EXECUTE.

CREATE FUNCTION audit_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: TRUNCATE of % is refused (retention drops whole partitions and records them)', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_truncate();

CREATE TABLE audit_chain_heads (
    chain      TEXT PRIMARY KEY,
    first_seq  BIGINT NOT NULL,
    last_seq   BIGINT NOT NULL,
    last_hash  TEXT NOT NULL,
    row_count  BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO audit_chain_heads (chain, first_seq, last_seq, last_hash, row_count)
SELECT chain, min(chain_seq), max(chain_seq), (array_agg(hash ORDER BY chain_seq DESC))[1], count(*)
FROM audit_events GROUP BY chain;

CREATE FUNCTION audit_track_heads() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO audit_chain_heads AS h (chain, first_seq, last_seq, last_hash, row_count)
    SELECT chain, min(chain_seq), max(chain_seq), (array_agg(hash ORDER BY chain_seq DESC))[1], count(*)
    FROM new_rows GROUP BY chain
    ON CONFLICT (chain) DO UPDATE SET
        first_seq = LEAST(h.first_seq, excluded.first_seq),
        last_hash = CASE WHEN excluded.last_seq > h.last_seq THEN excluded.last_hash ELSE h.last_hash END,
        last_seq = GREATEST(h.last_seq, excluded.last_seq),
        row_count = h.row_count + excluded.row_count,
        updated_at = now();
    RETURN NULL;
END $$;

CREATE TRIGGER audit_events_track_heads AFTER INSERT ON audit_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION audit_track_heads();

-- Inserting into a partition directly does not fire the parent's statement triggers: each
-- partition carries its own, for TRUNCATE and for the heads.
CREATE FUNCTION audit_protect_partition(part TEXT) RETURNS void LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(part) AND tgname = 'audit_no_truncate') THEN
        EXECUTE format('CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_truncate()', part);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(part) AND tgname = 'audit_track_heads') THEN
        EXECUTE format('CREATE TRIGGER audit_track_heads AFTER INSERT ON %I REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION audit_track_heads()', part);
    END IF;
END $$;

DO $$
DECLARE part TEXT;
BEGIN
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'audit_events'::regclass LOOP
        PERFORM audit_protect_partition(part);
    END LOOP;
END $$;

-- Creates the month partition holding `at` (UTC months) with the owner's rights, so that a
-- serving role that may not create tables can still write in a new month.
CREATE FUNCTION audit_ensure_partition(at TIMESTAMPTZ) RETURNS TEXT LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    start DATE := date_trunc('month', at AT TIME ZONE 'UTC')::date;
    part TEXT := 'audit_events_y' || to_char(start, 'YYYY') || 'm' || to_char(start, 'MM');
BEGIN
    IF to_regclass(part) IS NOT NULL THEN
        RETURN part;
    END IF;
    -- Two writers starting a month at once must not collide on CREATE.
    PERFORM pg_advisory_xact_lock(7470114);
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF audit_events FOR VALUES FROM (%L) TO (%L)', part,
            start::timestamp AT TIME ZONE 'UTC', (start + interval '1 month')::timestamp AT TIME ZONE 'UTC');
        PERFORM audit_protect_partition(part);
    END IF;
    RETURN part;
END $$;

CREATE TABLE audit_retention_ledger (
    id          BIGSERIAL PRIMARY KEY,
    partition   TEXT NOT NULL,
    range_end   TIMESTAMPTZ NOT NULL,
    dropped_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    dropped_by  TEXT NOT NULL DEFAULT current_user,
    -- [{chain, first_seq, last_seq, last_hash, rows}] of the rows that went with it.
    chains      JSONB NOT NULL
);

CREATE TABLE audit_checkpoints (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL,
    key_id     TEXT NOT NULL,
    -- The signed bytes (canonical JSON) and the Ed25519 signature over them, hex.
    body       TEXT NOT NULL,
    signature  TEXT NOT NULL
);

CREATE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER audit_retention_ledger_append_only BEFORE UPDATE OR DELETE ON audit_retention_ledger
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_retention_ledger_no_truncate BEFORE TRUNCATE ON audit_retention_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_truncate();
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_truncate();

REVOKE EXECUTE ON FUNCTION audit_ensure_partition(TIMESTAMPTZ), audit_protect_partition(TEXT),
    audit_track_heads() FROM PUBLIC;
