-- One delivery through the guard's per-message SQL on PostgreSQL, as `inbox` runs it for the
-- throughput benchmark's workload: 30% are duplicates of a message handled before (claim, which
-- reads the row found, and roll back: `inbox` sends the rollback with the connection's next
-- statement, pgbench with the claim), the rest new messages (claim and advance the stream in
-- one statement, credit one of :aggregates accounts, then in one round trip check the transaction is
-- open, commit, and begin and roll back the empty transaction `inbox` leaves for its next
-- statement to end).
-- `benches/throughput.rs` runs it with
-- `pgbench -n -M prepared -f benches/pgbench/guard.sql -D aggregates=N`.
\set account random(0, :aggregates - 1)
\set id random(1, 9000000000000000000)
\set copy random(1, 10)
\if :copy <= 3
BEGIN ISOLATION LEVEL READ COMMITTED;
\startpipeline
WITH claimed AS (INSERT INTO inbox_messages (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) VALUES ('pgbench', 'credit', 'seen', 'Credited', 'acct-0', 1, 'processed', '\x00', CURRENT_TIMESTAMP) ON CONFLICT (consumer, handler, message_id) DO NOTHING RETURNING 1) SELECT NULL::bytea, NULL::text, NULL::bigint, NULL::bigint FROM claimed UNION ALL SELECT payload_hash, status, retry_at_ms, NULL FROM inbox_messages WHERE consumer = 'pgbench' AND handler = 'credit' AND message_id = 'seen' AND NOT EXISTS (SELECT 1 FROM claimed);
ROLLBACK;
\endpipeline
\else
BEGIN ISOLATION LEVEL READ COMMITTED;
WITH claimed AS (INSERT INTO inbox_messages (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) VALUES ('pgbench', 'credit', 'm-' || :id, 'Credited', 'acct-' || :account, (extract(epoch FROM clock_timestamp()) * 1000000)::int8, 'processed', '\x00', CURRENT_TIMESTAMP) ON CONFLICT (consumer, handler, message_id) DO NOTHING RETURNING 1), advanced AS (INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) SELECT 'pgbench', 'credit', 'acct-' || :account, (extract(epoch FROM clock_timestamp()) * 1000000)::int8 FROM claimed ON CONFLICT (consumer, handler, aggregate_id) DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP WHERE inbox_streams.last_sequence < excluded.last_sequence RETURNING 1) SELECT NULL::bytea, NULL::text, NULL::bigint, (SELECT COUNT(*) FROM advanced) FROM claimed UNION ALL SELECT payload_hash, status, retry_at_ms, NULL FROM inbox_messages WHERE consumer = 'pgbench' AND handler = 'credit' AND message_id = 'm-' || :id AND NOT EXISTS (SELECT 1 FROM claimed);
UPDATE accounts SET balance = balance + 1 WHERE id = 'acct-' || :account;
\startpipeline
SELECT 1;
COMMIT;
BEGIN;
ROLLBACK;
\endpipeline
\endif
