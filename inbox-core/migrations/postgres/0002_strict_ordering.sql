-- Strict ordering: a message ahead of its aggregate's next sequence is parked with its payload
-- (and headers) until the gap fills; a gap that never fills marks it dead with a reason.
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS payload bytea;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS headers text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS error_text text;

CREATE INDEX IF NOT EXISTS inbox_messages_parked
    ON inbox_messages (consumer, handler, aggregate_id, sequence_number)
    WHERE status = 'parked';
