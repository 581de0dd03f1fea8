-- The PostgreSQL queue: messages between services that share a database, with no broker between
-- them. A consumer claims a row by making it invisible for a while (`visible_at`, the claim's
-- `claim_token`); settling deletes it. A row is claimed only once no older row of its aggregate
-- is left, so an aggregate's messages are handled one at a time, in the order they were
-- enqueued.
CREATE TABLE IF NOT EXISTS inbox_queue (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL,
    message_id   text        NOT NULL,
    message_type text        NOT NULL CHECK (message_type <> ''),
    aggregate_id text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    visible_at   timestamptz NOT NULL DEFAULT now(),
    deliveries   int         NOT NULL DEFAULT 0,
    claim_token  text
);

-- The claim: a queue's rows in the order they were enqueued.
CREATE INDEX IF NOT EXISTS inbox_queue_order ON inbox_queue (queue, id);

-- The claim's order check: an older row of the same aggregate.
CREATE INDEX IF NOT EXISTS inbox_queue_aggregate
    ON inbox_queue (queue, aggregate_id, id) WHERE aggregate_id IS NOT NULL;

-- Wakes the queue's consumers (`LISTEN inbox_queue`, the queue's name as the payload) when a
-- transaction that enqueued commits.
CREATE OR REPLACE FUNCTION inbox_queue_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inbox_queue', NEW.queue);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS inbox_queue_enqueued ON inbox_queue;
CREATE TRIGGER inbox_queue_enqueued AFTER INSERT ON inbox_queue
    FOR EACH ROW EXECUTE FUNCTION inbox_queue_notify();
