-- Dedup records move to a rowid table, their id under a unique index. Message ids are random, so
-- in a table clustered on them (WITHOUT ROWID) every new row lands on a page of its own and
-- carries its whole row there: a batch of a hundred new messages split and rewrote about as many
-- full pages, and a failed or parked row's payload made its page hold even fewer. Here a new row
-- is appended, and only its id goes to a random place, in a narrow index. The table is rebuilt
-- once, with its rows and indexes as they were.
CREATE TABLE inbox_messages_rebuilt (
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
    payload         BLOB,
    headers         TEXT,
    error_text      TEXT,
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    first_error     TEXT,
    failed_at       TEXT,
    resolution      TEXT,
    resolved_by     TEXT,
    resolved_reason TEXT,
    resolved_at     TEXT,
    retry_at_ms     INTEGER,
    dead_reason     TEXT
);

INSERT INTO inbox_messages_rebuilt (
    consumer, handler, message_id, message_type, aggregate_id, sequence_number, status,
    payload_hash, received_at, processed_at, payload, headers, error_text, attempt_count,
    first_error, failed_at, resolution, resolved_by, resolved_reason, resolved_at, retry_at_ms,
    dead_reason)
SELECT
    consumer, handler, message_id, message_type, aggregate_id, sequence_number, status,
    payload_hash, received_at, processed_at, payload, headers, error_text, attempt_count,
    first_error, failed_at, resolution, resolved_by, resolved_reason, resolved_at, retry_at_ms,
    dead_reason
FROM inbox_messages;

DROP TABLE inbox_messages;
ALTER TABLE inbox_messages_rebuilt RENAME TO inbox_messages;

CREATE UNIQUE INDEX inbox_messages_id ON inbox_messages (consumer, handler, message_id);

CREATE INDEX inbox_messages_processed_at
    ON inbox_messages (processed_at)
    WHERE status IN ('processed', 'stale');

CREATE INDEX inbox_messages_parked
    ON inbox_messages (consumer, handler, aggregate_id, sequence_number)
    WHERE status = 'parked';

CREATE INDEX inbox_messages_dead
    ON inbox_messages (consumer, status, handler)
    WHERE status = 'dead';

CREATE INDEX inbox_messages_failed
    ON inbox_messages (consumer, status, handler)
    WHERE status = 'failed';

CREATE INDEX inbox_messages_retry_due
    ON inbox_messages (consumer, handler, retry_at_ms)
    WHERE status = 'failed';

CREATE INDEX inbox_messages_failed_sequence
    ON inbox_messages (consumer, handler, aggregate_id, sequence_number)
    WHERE status = 'failed';
