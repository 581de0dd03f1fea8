-- Dedup records: one row per (consumer, handler, message id), under the primary key.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer        TEXT    NOT NULL,
    handler         TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    message_type    TEXT    NOT NULL,
    aggregate_id    TEXT,
    sequence_number INTEGER,
    status          TEXT    NOT NULL,
    payload_hash    BLOB    NOT NULL,
    received_at     TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    processed_at    TEXT,
    PRIMARY KEY (consumer, handler, message_id)
) WITHOUT ROWID;

-- Retention deletes old processed rows by age without scanning the table.
CREATE INDEX IF NOT EXISTS inbox_messages_processed_at
    ON inbox_messages (processed_at)
    WHERE status IN ('processed', 'stale');

-- Ordering guard: the last applied sequence per (consumer, handler, aggregate).
CREATE TABLE IF NOT EXISTS inbox_streams (
    consumer      TEXT    NOT NULL,
    handler       TEXT    NOT NULL,
    aggregate_id  TEXT    NOT NULL,
    last_sequence INTEGER NOT NULL,
    updated_at    TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (consumer, handler, aggregate_id)
) WITHOUT ROWID;
