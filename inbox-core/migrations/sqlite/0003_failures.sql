-- Failures: a message whose handler failed is kept with its payload, the number of failed
-- attempts and the first and last error, as `failed` (to be retried) or `dead` (given up).
ALTER TABLE inbox_messages ADD COLUMN attempt_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN first_error TEXT;
