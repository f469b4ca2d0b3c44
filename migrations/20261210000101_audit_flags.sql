-- Rows whose stored text differs from what was submitted (a NUL escaped, an oversized field
-- cut) or that were isolated from a batch the database refused say so here, as a JSON
-- object. It is part of the hashed content when present; older rows have none and keep
-- their hashes.
ALTER TABLE audit_events ADD COLUMN flags TEXT;
