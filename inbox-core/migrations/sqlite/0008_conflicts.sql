-- Conflicts: a delivery whose id was seen before with other content (another payload hash) is
-- never applied. It is kept here, with its payload and headers, next to the message stored
-- under its id (`consumer`, `handler`, `message_id` of `inbox_messages`, whose hash was
-- `stored_payload_hash`), for an operator. Each content of an id is one row; `deliveries`
-- counts how often it came. `resolution`: `NULL` while it waits for an operator.
CREATE TABLE IF NOT EXISTS inbox_conflicts (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer            TEXT    NOT NULL,
    handler             TEXT    NOT NULL,
    message_id          TEXT    NOT NULL,
    message_type        TEXT    NOT NULL,
    payload_hash        BLOB    NOT NULL,
    stored_payload_hash BLOB    NOT NULL,
    payload             BLOB    NOT NULL,
    headers             TEXT    NOT NULL,
    deliveries          INTEGER NOT NULL DEFAULT 1,
    first_seen_at       TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    last_seen_at        TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    resolution          TEXT,
    resolved_by         TEXT,
    resolved_reason     TEXT,
    resolved_at         TEXT,
    UNIQUE (consumer, handler, message_id, payload_hash)
);

-- The conflicts waiting for an operator, by consumer.
CREATE INDEX IF NOT EXISTS inbox_conflicts_open
    ON inbox_conflicts (consumer, handler) WHERE resolution IS NULL;
