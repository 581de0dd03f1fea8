-- Failures: a message whose handler failed is kept with its payload, the number of failed
-- attempts and the first and last error, as `failed` (to be retried) or `dead` (given up).
ALTER TABLE inbox_messages ADD COLUMN attempt_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN first_error TEXT;

-- What an operator did about a dead message: replayed it or discarded it, who, why and when.
ALTER TABLE inbox_messages ADD COLUMN resolution TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_by TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_reason TEXT;
ALTER TABLE inbox_messages ADD COLUMN resolved_at TEXT;
