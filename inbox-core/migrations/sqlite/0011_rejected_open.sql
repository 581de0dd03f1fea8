-- The rejected deliveries an operator has not resolved, and those whose replay was requested:
-- every sweep looks for the latter, so they are found through an index instead of a scan of all
-- the deliveries kept (as MySQL's `inbox_rejected_open` does since its first migration).
CREATE INDEX IF NOT EXISTS inbox_rejected_open
    ON inbox_rejected (consumer, resolution);
