-- Dedup records: one row per (consumer, handler, message id), under the primary key.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer        text        NOT NULL,
    handler         text        NOT NULL,
    message_id      text        NOT NULL,
    message_type    text        NOT NULL,
    aggregate_id    text,
    sequence_number bigint,
    status          text        NOT NULL,
    payload_hash    bytea       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz,
    PRIMARY KEY (consumer, handler, message_id)
);

-- Retention deletes old processed rows by age without scanning the table.
CREATE INDEX IF NOT EXISTS inbox_messages_processed_at
    ON inbox_messages (processed_at)
    WHERE status IN ('processed', 'stale');

-- Ordering guard: the last applied sequence per (consumer, handler, aggregate).
CREATE TABLE IF NOT EXISTS inbox_streams (
    consumer      text        NOT NULL,
    handler       text        NOT NULL,
    aggregate_id  text        NOT NULL,
    last_sequence bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, handler, aggregate_id)
);
