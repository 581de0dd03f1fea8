-- What operators did, one row per action: a later action never erases an earlier one, and a
-- replay that failed says so. An action is on a dedup row (`handler`, `message_id`), on the gap
-- of a stream (`handler`, `aggregate_id`), or on a rejected delivery (`rejected_id`).
-- `action`: `replay`, `discard`, `skip_gap`, `replay_rejected`, `discard_rejected`. `outcome`
-- is what came of it once that is known (`NULL` while the running consumer has yet to act).
CREATE TABLE IF NOT EXISTS inbox_actions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer     TEXT    NOT NULL,
    handler      TEXT,
    message_id   TEXT,
    aggregate_id TEXT,
    rejected_id  INTEGER,
    action       TEXT    NOT NULL,
    performed_by TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    performed_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    outcome      TEXT,
    outcome_at   TEXT
);

-- A message's history, and that of the gaps of its aggregate.
CREATE INDEX IF NOT EXISTS inbox_actions_message
    ON inbox_actions (consumer, handler, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS inbox_actions_stream
    ON inbox_actions (consumer, handler, aggregate_id) WHERE aggregate_id IS NOT NULL;

-- A rejected delivery's history.
CREATE INDEX IF NOT EXISTS inbox_actions_rejected
    ON inbox_actions (rejected_id) WHERE rejected_id IS NOT NULL;
