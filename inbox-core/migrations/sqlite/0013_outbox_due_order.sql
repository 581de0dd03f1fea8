-- The relay claims due messages in the order they fell due (then as written), not only as
-- written: a message tried again waits behind those that fell due before it, so the messages of
-- a destination that cannot take them, tried again and again, do not keep the relay from
-- messages written after them.
CREATE INDEX IF NOT EXISTS inbox_outbox_due ON inbox_outbox (due_at_ms, position)
    WHERE status = 'pending';
DROP INDEX IF EXISTS inbox_outbox_pending;
