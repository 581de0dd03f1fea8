-- Strict ordering: a message ahead of its aggregate's next sequence is parked with its payload
-- (and headers) until the gap fills; a gap that never fills marks it dead with a reason.
ALTER TABLE inbox_messages ADD COLUMN payload BLOB;
ALTER TABLE inbox_messages ADD COLUMN headers TEXT;
ALTER TABLE inbox_messages ADD COLUMN error_text TEXT;

CREATE INDEX IF NOT EXISTS inbox_messages_parked
    ON inbox_messages (consumer, handler, aggregate_id, sequence_number)
    WHERE status = 'parked';
