-- The outbox: messages written in the application's own transactions, published by a relay.
-- `position` is the order rows were written in; `id` (a UUIDv7) is the envelope id downstream,
-- so that the receiving inbox drops what a relay publishes twice. Times are Unix epoch
-- milliseconds, UTC.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    position           INTEGER PRIMARY KEY AUTOINCREMENT,
    id                 TEXT    NOT NULL UNIQUE,
    message_type       TEXT    NOT NULL,
    destination        TEXT,
    aggregate_id       TEXT,
    aggregate_sequence INTEGER,
    payload            BLOB    NOT NULL,
    headers            TEXT    NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending',
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    due_at_ms          INTEGER NOT NULL DEFAULT 0,
    created_at_ms      INTEGER NOT NULL,
    published_at_ms    INTEGER
);

-- The last sequence written per aggregate.
CREATE TABLE IF NOT EXISTS inbox_outbox_streams (
    aggregate_id  TEXT    PRIMARY KEY,
    last_sequence INTEGER NOT NULL
);

-- The relay's claim: pending rows in the order they were written.
CREATE INDEX IF NOT EXISTS inbox_outbox_pending ON inbox_outbox (position) WHERE status = 'pending';

-- The claim's order check: an aggregate's rows not published yet, by sequence.
CREATE INDEX IF NOT EXISTS inbox_outbox_unpublished
    ON inbox_outbox (aggregate_id, aggregate_sequence) WHERE status <> 'published';

-- Retention: published rows, oldest first.
CREATE INDEX IF NOT EXISTS inbox_outbox_published
    ON inbox_outbox (published_at_ms) WHERE status = 'published';
