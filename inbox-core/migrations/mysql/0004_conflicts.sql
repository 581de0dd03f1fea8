-- Conflicts: a delivery whose id was seen before with other content (another payload hash) is
-- never applied. It is kept here, with its payload and headers, next to the message stored
-- under its id (`consumer`, `handler`, `message_id` of `inbox_messages`, whose hash was
-- `stored_payload_hash`), for an operator. Each content of an id is one row; `deliveries`
-- counts how often it came. `resolution`: `NULL` while it waits for an operator.
CREATE TABLE IF NOT EXISTS inbox_conflicts (
    id                  BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer            VARCHAR(100)  NOT NULL,
    handler             VARCHAR(100)  NOT NULL,
    message_id          VARCHAR(512)  NOT NULL,
    message_type        VARCHAR(255)  NOT NULL,
    payload_hash        VARBINARY(32) NOT NULL,
    stored_payload_hash VARBINARY(32) NOT NULL,
    payload             LONGBLOB      NOT NULL,
    headers             MEDIUMTEXT    NOT NULL,
    deliveries          BIGINT        NOT NULL DEFAULT 1,
    first_seen_at       DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_seen_at        DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    resolution          VARCHAR(16),
    resolved_by         MEDIUMTEXT,
    resolved_reason     MEDIUMTEXT,
    resolved_at         DATETIME(6),
    UNIQUE KEY inbox_conflicts_content (consumer, handler, message_id, payload_hash),
    -- The conflicts waiting for an operator, by consumer.
    KEY inbox_conflicts_open (consumer, resolution, handler)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
