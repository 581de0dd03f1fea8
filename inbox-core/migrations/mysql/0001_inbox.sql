-- The inbox schema for MySQL 8 and MariaDB 10.11 (InnoDB), in one step: the other databases
-- reached the same tables over five migrations.
--
-- Keys compare byte for byte (utf8mb4_bin), as they do on PostgreSQL and SQLite: under a
-- case-insensitive collation `E-1` would be a duplicate of `e-1`. Their lengths keep each index
-- within InnoDB's 3072 bytes: consumer and handler names up to 100 characters, message ids and
-- aggregates up to 512 (the inbox's `MAX_ID_LEN` in bytes). Times are UTC (sqlx sets the
-- session's time zone) with microseconds.
--
-- MySQL has no partial indexes. The purge's index is on a generated column that holds
-- `processed_at` only for purgeable rows, so a batch reads exactly its rows in order; the
-- other partial indexes become composite ones that lead with the status, so every sweep and
-- listing reads only the rows of the status it asks for.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer        VARCHAR(100) NOT NULL,
    handler         VARCHAR(100) NOT NULL,
    message_id      VARCHAR(512) NOT NULL,
    message_type    VARCHAR(255) NOT NULL,
    aggregate_id    VARCHAR(512),
    sequence_number BIGINT,
    status          VARCHAR(16)  NOT NULL,
    payload_hash    VARBINARY(32) NOT NULL,
    payload         LONGBLOB,
    headers         MEDIUMTEXT,
    attempt_count   INT          NOT NULL DEFAULT 0,
    first_error     MEDIUMTEXT,
    error_text      MEDIUMTEXT,
    dead_reason     VARCHAR(16),
    retry_at_ms     BIGINT,
    received_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    processed_at    DATETIME(6),
    failed_at       DATETIME(6),
    resolution      VARCHAR(16),
    resolved_by     MEDIUMTEXT,
    resolved_reason MEDIUMTEXT,
    resolved_at     DATETIME(6),
    -- `processed_at` of a row a purge may delete, NULL for every other row.
    purge_at        DATETIME(6) AS (CASE WHEN status IN ('processed', 'stale') THEN processed_at END) STORED,
    PRIMARY KEY (consumer, handler, message_id),
    -- Retention: the purgeable rows, oldest first.
    KEY inbox_messages_purge (purge_at),
    -- Strict ordering: a stream's parked, failed or dead messages by sequence.
    KEY inbox_messages_stream (consumer, handler, aggregate_id, status, sequence_number),
    -- Sweeps: a handler's parked messages, and its failed ones by when their retry is due.
    KEY inbox_messages_sweep (consumer, handler, status, retry_at_ms),
    -- Gauges and listings: a consumer's messages of one status, by handler.
    KEY inbox_messages_status (consumer, status, handler)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Ordering guard: the last applied sequence per (consumer, handler, aggregate).
CREATE TABLE IF NOT EXISTS inbox_streams (
    consumer      VARCHAR(100) NOT NULL,
    handler       VARCHAR(100) NOT NULL,
    aggregate_id  VARCHAR(512) NOT NULL,
    last_sequence BIGINT       NOT NULL,
    updated_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, handler, aggregate_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Deliveries that could not be handled at all, kept with their exact bytes and the reason.
CREATE TABLE IF NOT EXISTS inbox_rejected (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer        VARCHAR(100) NOT NULL,
    message_type    MEDIUMTEXT   NOT NULL,
    delivery_id     MEDIUMTEXT   NOT NULL,
    payload         LONGBLOB     NOT NULL,
    headers         MEDIUMTEXT   NOT NULL,
    reason          MEDIUMTEXT   NOT NULL,
    received_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    resolution      VARCHAR(16),
    resolved_by     MEDIUMTEXT,
    resolved_reason MEDIUMTEXT,
    resolved_at     DATETIME(6),
    KEY inbox_rejected_open (consumer, resolution)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
