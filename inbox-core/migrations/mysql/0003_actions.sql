-- What operators did, one row per action: a later action never erases an earlier one, and a
-- replay that failed says so. An action is on a dedup row (`handler`, `message_id`), on the gap
-- of a stream (`handler`, `aggregate_id`), or on a rejected delivery (`rejected_id`).
-- `action`: `replay`, `discard`, `skip_gap`, `replay_rejected`, `discard_rejected`. `outcome`
-- is what came of it once that is known (`NULL` while the running consumer has yet to act).
CREATE TABLE IF NOT EXISTS inbox_actions (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer     VARCHAR(100) NOT NULL,
    handler      VARCHAR(100),
    message_id   VARCHAR(512),
    aggregate_id VARCHAR(512),
    rejected_id  BIGINT,
    action       VARCHAR(32)  NOT NULL,
    performed_by MEDIUMTEXT   NOT NULL,
    reason       MEDIUMTEXT   NOT NULL,
    performed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    outcome      MEDIUMTEXT,
    outcome_at   DATETIME(6),
    -- A message's history, and that of the gaps of its aggregate.
    KEY inbox_actions_message (consumer, handler, message_id),
    KEY inbox_actions_stream (consumer, handler, aggregate_id),
    -- A rejected delivery's history.
    KEY inbox_actions_rejected (rejected_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
