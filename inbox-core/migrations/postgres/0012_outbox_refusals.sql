-- How many of a message's attempts the broker refused. Only refusals spend the relay's retry
-- budget: tries the broker was out of reach for count in `attempts` and its backoff, never
-- toward giving the message up.
ALTER TABLE inbox_outbox ADD COLUMN IF NOT EXISTS refusals int NOT NULL DEFAULT 0;
