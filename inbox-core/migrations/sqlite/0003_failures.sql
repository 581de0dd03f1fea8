-- Failures: a message whose handler failed is kept with its payload, the number of failed
-- attempts and the first and last error, as `failed` (to be retried) or `dead` (given up).
ALTER TABLE inbox_messages ADD COLUMN attempt_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN first_error TEXT;
ALTER TABLE inbox_messages ADD COLUMN failed_at TEXT;

-- What an operator did about a dead message: replayed it or discarded it, who, why and when.
ALTER TABLE inbox_messages ADD COLUMN resolution TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_by TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_reason TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_at TEXT;

-- Deliveries that could not be handled at all (unknown type, undecodable payload, unusable id,
-- oversized payload), kept with their exact bytes and the reason.
CREATE TABLE IF NOT EXISTS inbox_rejected (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer        TEXT    NOT NULL,
    message_type    TEXT    NOT NULL,
    delivery_id     TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    received_at     TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    resolution      TEXT,
    resolved_by     TEXT,
    resolved_reason TEXT,
    resolved_at     TEXT
);
