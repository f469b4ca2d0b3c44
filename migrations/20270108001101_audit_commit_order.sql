-- Incremental reads (`after_id`, the audit sinks) need an order in which no row can appear
-- behind one already read. Ids do not give it: two instances take ids from one sequence and
-- commit in either order, so id 10 can be visible while id 9 is still in flight. Each row now
-- keeps the id of the transaction that wrote it; a reader takes only rows whose transaction is
-- older than every transaction still running (its snapshot's xmin) and walks them in
-- (tx, id) order, so every row that can still appear sorts after what it has read.
--
-- Rows written before this have tx 0: all of them were committed long ago and sort first, by
-- id. A constant default adds the column without rewriting the table; new rows get the
-- writing transaction's id. Not hashed: the chain is unchanged.
ALTER TABLE audit_events ADD COLUMN tx xid8 NOT NULL DEFAULT '0';
ALTER TABLE audit_events ALTER COLUMN tx SET DEFAULT pg_current_xact_id();

CREATE INDEX audit_events_tx_idx ON audit_events (tx, id);
