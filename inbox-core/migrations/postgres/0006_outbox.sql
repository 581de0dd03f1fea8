-- The outbox: messages written in the application's own transactions, published by a relay.
-- `position` is the order rows were written in; `id` (a UUIDv7) is the envelope id downstream,
-- so that the receiving inbox drops what a relay publishes twice. Times are Unix epoch
-- milliseconds, UTC.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    position           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                 text   NOT NULL UNIQUE,
    message_type       text   NOT NULL,
    destination        text,
    aggregate_id       text,
    aggregate_sequence bigint,
    payload            bytea  NOT NULL,
    headers            text   NOT NULL,
    status             text   NOT NULL DEFAULT 'pending',
    attempts           int    NOT NULL DEFAULT 0,
    last_error         text,
    due_at_ms          bigint NOT NULL DEFAULT 0,
    created_at_ms      bigint NOT NULL,
    published_at_ms    bigint
);

-- The last sequence written per aggregate. Writing a message of an aggregate takes its row's
-- lock until the transaction ends, so the sequences of an aggregate follow commit order.
CREATE TABLE IF NOT EXISTS inbox_outbox_streams (
    aggregate_id  text   PRIMARY KEY,
    last_sequence bigint NOT NULL
);

-- The relay's claim: pending rows in the order they were written.
CREATE INDEX IF NOT EXISTS inbox_outbox_pending ON inbox_outbox (position) WHERE status = 'pending';

-- The claim's order check: an aggregate's rows not published yet, by sequence.
CREATE INDEX IF NOT EXISTS inbox_outbox_unpublished
    ON inbox_outbox (aggregate_id, aggregate_sequence) WHERE status <> 'published';

-- Retention: published rows, oldest first.
CREATE INDEX IF NOT EXISTS inbox_outbox_published
    ON inbox_outbox (published_at_ms) WHERE status = 'published';

-- Wakes the relays (`LISTEN inbox_outbox`) when a transaction that wrote to the outbox commits.
CREATE OR REPLACE FUNCTION inbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inbox_outbox', '');
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS inbox_outbox_written ON inbox_outbox;
CREATE TRIGGER inbox_outbox_written AFTER INSERT ON inbox_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION inbox_outbox_notify();
