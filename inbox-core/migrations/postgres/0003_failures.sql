-- Failures: a message whose handler failed is kept with its payload, the number of failed
-- attempts and the first and last error, as `failed` (to be retried) or `dead` (given up).
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS attempt_count integer NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS first_error text;

-- What an operator did about a dead message: replayed it or discarded it, who, why and when.
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolution text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_by text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_reason text;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS resolved_at timestamptz;
