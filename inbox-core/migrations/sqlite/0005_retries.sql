-- Retries owned by the store: a failed message carries when its next attempt is due (Unix epoch
-- milliseconds, UTC), so a redelivery that comes earlier is handed back without running the
-- handler, and the runtime retries due messages itself when no redelivery comes.
ALTER TABLE inbox_messages ADD COLUMN retry_at_ms INTEGER;
UPDATE inbox_messages SET retry_at_ms = 0 WHERE status = 'failed' AND retry_at_ms IS NULL;

-- Why a message is dead, as a column code acts on: `gap_timeout` (its strict ordering gap never
-- filled; skipping the gap brings it back), `gave_up` (attempts exhausted, or a permanent error),
-- `undecodable` (its stored payload no longer decodes).
ALTER TABLE inbox_messages ADD COLUMN dead_reason TEXT;
UPDATE inbox_messages SET dead_reason = 'gap_timeout'
    WHERE status = 'dead' AND error_text LIKE 'gap timeout at sequence %';
UPDATE inbox_messages SET dead_reason = 'gave_up' WHERE status = 'dead' AND dead_reason IS NULL;

-- The due retries of a handler, soonest first.
CREATE INDEX IF NOT EXISTS inbox_messages_retry_due
    ON inbox_messages (consumer, handler, retry_at_ms)
    WHERE status = 'failed';

-- A strict stream's missing sequence that is only retrying: a gap timeout leaves it alone.
CREATE INDEX IF NOT EXISTS inbox_messages_failed_sequence
    ON inbox_messages (consumer, handler, aggregate_id, sequence_number)
    WHERE status = 'failed';
