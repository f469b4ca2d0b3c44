-- A cursor keeps its whole position in commit order, the transaction as well as the row id,
-- so it does not depend on its row still existing: retention may drop the partition that
-- holds it, and the sink or rollup follower goes on from the same place. (Before this, such a
-- cursor compared against a row that was gone and silently read nothing more.)
ALTER TABLE audit_sink_cursors ADD COLUMN after_tx xid8;
UPDATE audit_sink_cursors s SET after_tx = e.tx FROM audit_events e WHERE e.id = s.after_id;
