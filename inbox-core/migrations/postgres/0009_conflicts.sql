-- Conflicts: a delivery whose id was seen before with other content (another payload hash) is
-- never applied. It is kept here, with its payload and headers, next to the message stored
-- under its id (`consumer`, `handler`, `message_id` of `inbox_messages`, whose hash was
-- `stored_payload_hash`), for an operator. Each content of an id is one row; `deliveries`
-- counts how often it came. `resolution`: `NULL` while it waits for an operator.
CREATE TABLE IF NOT EXISTS inbox_conflicts (
    id                  bigserial   PRIMARY KEY,
    consumer            text        NOT NULL,
    handler             text        NOT NULL,
    message_id          text        NOT NULL,
    message_type        text        NOT NULL,
    payload_hash        bytea       NOT NULL,
    stored_payload_hash bytea       NOT NULL,
    payload             bytea       NOT NULL,
    headers             text        NOT NULL,
    deliveries          bigint      NOT NULL DEFAULT 1,
    first_seen_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at        timestamptz NOT NULL DEFAULT now(),
    resolution          text,
    resolved_by         text,
    resolved_reason     text,
    resolved_at         timestamptz,
    UNIQUE (consumer, handler, message_id, payload_hash)
);

-- The conflicts waiting for an operator, by consumer.
CREATE INDEX IF NOT EXISTS inbox_conflicts_open
    ON inbox_conflicts (consumer, handler) WHERE resolution IS NULL;
