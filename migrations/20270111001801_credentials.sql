-- Credentials a tool group's slots need (`x-toolgate-credentials`), one per slot and owner: an
-- agent, a person, or everyone (`shared`). Envelope encryption: `ciphertext` is the value under
-- a data key of its own (AES-256-GCM), `wrapped_key` that data key under the key-encryption key
-- `kek_id`, which is never in the database. Both are bound to the row's slot (owner kind, owner,
-- group, name) as associated data: a ciphertext copied onto another agent's row does not open.
CREATE TABLE credentials (
    owner_kind    TEXT NOT NULL CHECK (owner_kind IN ('agent', 'person', 'shared')),
    owner         TEXT NOT NULL,
    group_name    TEXT NOT NULL,
    name          TEXT NOT NULL,
    kek_id        TEXT NOT NULL,
    wrapped_key   BYTEA NOT NULL,
    ciphertext    BYTEA NOT NULL,
    created_by    TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at  TIMESTAMPTZ,
    PRIMARY KEY (owner_kind, owner, group_name, name)
);

-- Every instance re-reads the (sealed) credentials when one changes, as for a grant.
CREATE TRIGGER credentials_notify AFTER INSERT OR UPDATE OF kek_id, wrapped_key, ciphertext OR DELETE
    ON credentials FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();
