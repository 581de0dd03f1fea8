-- MariaDB from 11.4.5 knows `utf8mb4_0900_bin` as another name for `utf8mb4_bin`, a PAD SPACE
-- collation, so 0006 (which took `utf8mb4_0900_bin` wherever it was known) left the keys there
-- comparing `e-1` and `e-1 ` equal. MariaDB's own NO PAD binary collation, `utf8mb4_nopad_bin`,
-- comes first now; MySQL 8 has only `utf8mb4_0900_bin`, which is NO PAD there. A table already
-- in the collation is left as it is (no rebuild).
SET @inbox_collation = IF(
    EXISTS (SELECT 1 FROM information_schema.COLLATIONS WHERE COLLATION_NAME = 'utf8mb4_nopad_bin'),
    'utf8mb4_nopad_bin', 'utf8mb4_0900_bin');

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_messages CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_streams') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_streams CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_rejected') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_rejected CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_outbox') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_outbox CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_outbox_streams') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_outbox_streams CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_actions') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_actions CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = IF(
    (SELECT TABLE_COLLATION FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_conflicts') = @inbox_collation,
    'DO 0',
    CONCAT('ALTER TABLE inbox_conflicts CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation));
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

DEALLOCATE PREPARE inbox_convert;
