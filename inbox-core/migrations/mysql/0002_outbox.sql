-- The outbox: messages written in the application's own transactions, published by a relay.
-- `position` is the order rows were written in; `id` (a UUIDv7) is the envelope id downstream,
-- so that the receiving inbox drops what a relay publishes twice. Times are Unix epoch
-- milliseconds, UTC. With no partial indexes, the indexes lead with the status.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    position           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id                 VARCHAR(64)  NOT NULL,
    message_type       VARCHAR(255) NOT NULL,
    destination        VARCHAR(512),
    aggregate_id       VARCHAR(512),
    aggregate_sequence BIGINT,
    payload            LONGBLOB     NOT NULL,
    headers            MEDIUMTEXT   NOT NULL,
    status             VARCHAR(16)  NOT NULL DEFAULT 'pending',
    attempts           INT          NOT NULL DEFAULT 0,
    last_error         MEDIUMTEXT,
    due_at_ms          BIGINT       NOT NULL DEFAULT 0,
    created_at_ms      BIGINT       NOT NULL,
    published_at_ms    BIGINT,
    UNIQUE KEY inbox_outbox_id (id),
    -- The relay's claim: pending rows in the order they were written.
    KEY inbox_outbox_pending (status, position),
    -- The claim's order check: an aggregate's rows by sequence.
    KEY inbox_outbox_aggregate (aggregate_id, aggregate_sequence, status),
    -- Retention: published rows, oldest first.
    KEY inbox_outbox_published (status, published_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The last sequence written per aggregate. Writing a message of an aggregate takes its row's
-- lock until the transaction ends, so the sequences of an aggregate follow commit order.
CREATE TABLE IF NOT EXISTS inbox_outbox_streams (
    aggregate_id  VARCHAR(512) NOT NULL PRIMARY KEY,
    last_sequence BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
