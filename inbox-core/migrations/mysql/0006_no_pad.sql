-- Keys compare byte for byte, trailing spaces included: `utf8mb4_bin` is a PAD SPACE collation,
-- under which `e-1` and `e-1 ` are one key, so a message whose id ends in a space was taken for
-- a duplicate of another. Every table moves to the binary NO PAD collation, whose name differs:
-- `utf8mb4_0900_bin` on MySQL 8, `utf8mb4_nopad_bin` on MariaDB.
SET @inbox_collation = IF(
    EXISTS (SELECT 1 FROM information_schema.COLLATIONS WHERE COLLATION_NAME = 'utf8mb4_0900_bin'),
    'utf8mb4_0900_bin', 'utf8mb4_nopad_bin');

SET @inbox_convert = CONCAT('ALTER TABLE inbox_messages CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_streams CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_rejected CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_outbox CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_outbox_streams CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_actions CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

SET @inbox_convert = CONCAT('ALTER TABLE inbox_conflicts CONVERT TO CHARACTER SET utf8mb4 COLLATE ', @inbox_collation);
PREPARE inbox_convert FROM @inbox_convert;
EXECUTE inbox_convert;

DEALLOCATE PREPARE inbox_convert;
