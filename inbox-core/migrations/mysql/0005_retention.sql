-- Retention of what operators resolved: a purge deletes, once they are older than its window,
-- the discarded dead letters, the rejected deliveries replayed or discarded, the conflicts
-- resolved, and the history of operators' actions whose row is gone. Each is found through an
-- index on the time it was resolved (or performed), so a purge never scans a table (MySQL has
-- no partial indexes: a dead letter's status leads its key; a row not resolved has no time).
CREATE INDEX inbox_messages_discarded ON inbox_messages (status, resolved_at);

CREATE INDEX inbox_rejected_resolved ON inbox_rejected (resolved_at);

CREATE INDEX inbox_conflicts_resolved ON inbox_conflicts (resolved_at);

CREATE INDEX inbox_actions_performed ON inbox_actions (performed_at);
