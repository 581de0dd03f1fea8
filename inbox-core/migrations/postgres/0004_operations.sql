-- Operations: the dead letters and the failed messages (those an operator asked to replay among
-- them) are found through their own small indexes, so gauges, listings and replays never scan
-- the table of processed rows.
CREATE INDEX IF NOT EXISTS inbox_messages_dead
    ON inbox_messages (consumer, status, handler)
    WHERE status = 'dead';

CREATE INDEX IF NOT EXISTS inbox_messages_failed
    ON inbox_messages (consumer, status, handler)
    WHERE status = 'failed';
