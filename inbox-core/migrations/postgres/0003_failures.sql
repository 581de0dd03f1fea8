-- Failures: a message whose handler failed is kept with its payload, the number of failed
-- attempts and the first and last error, as `failed` (to be retried) or `dead` (given up).
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS attempt_count integer NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS first_error text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS failed_at timestamptz;

-- What an operator did about a dead message: replayed it or discarded it, who, why and when.
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolution text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_by text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_reason text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_at timestamptz;

-- Deliveries that could not be handled at all (unknown type, undecodable payload, unusable id,
-- oversized payload), kept with their exact bytes and the reason.
CREATE TABLE IF NOT EXISTS inbox_rejected (
    id              bigserial   PRIMARY KEY,
    consumer        text        NOT NULL,
    message_type    text        NOT NULL,
    delivery_id     text        NOT NULL,
    payload         bytea       NOT NULL,
    headers         text        NOT NULL,
    reason          text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    resolution      text,
    resolved_by     text,
    resolved_reason text,
    resolved_at     timestamptz
);
