-- Retention of what operators resolved: a purge deletes, once they are older than its window,
-- the discarded dead letters, the rejected deliveries replayed or discarded, the conflicts
-- resolved, and the history of operators' actions whose row is gone. Each is found through an
-- index on the time it was resolved (or performed), so a purge never scans a table.
CREATE INDEX IF NOT EXISTS inbox_messages_discarded
    ON inbox_messages (resolved_at)
    WHERE status = 'discarded';

CREATE INDEX IF NOT EXISTS inbox_rejected_resolved
    ON inbox_rejected (resolved_at)
    WHERE resolution IS NOT NULL;

CREATE INDEX IF NOT EXISTS inbox_conflicts_resolved
    ON inbox_conflicts (resolved_at)
    WHERE resolution IS NOT NULL;

CREATE INDEX IF NOT EXISTS inbox_actions_performed
    ON inbox_actions (performed_at);
