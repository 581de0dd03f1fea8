//! The outbox on real databases: what a handler or an application transaction publishes exists
//! exactly when the transaction commits; the relay publishes it at least once, in order per
//! aggregate even with two relays at once; a relay that dies between publishing and marking
//! publishes again, and the receiving inbox drops the copy; a message the broker refuses is kept
//! with its error until an operator retries it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use inbox::prelude::*;
use inbox::{Envelope, Sink, SinkError};

/// What a handler publishes when it credits an account: in the account's aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Message)]
#[message(name = "test.receipt", aggregate = "account")]
pub struct Receipt {
    pub receipt_id: String,
    pub account: String,
    pub number: i64,
}

/// A sink that records what it was asked to publish, in the order the broker would see it,
/// after a short random pause (so that publications of one batch, or of two relays, interleave),
/// and can refuse one type of message, or stall after a number of publications (a relay that
/// dies before it marks them).
#[derive(Clone, Default)]
pub struct Recorder {
    published: Arc<Mutex<Vec<Envelope>>>,
    refuse: Option<&'static str>,
    unavailable: bool,
    stall_after: Option<usize>,
    stalled: Arc<tokio::sync::Notify>,
    /// How many publications it was asked for.
    asked: Arc<std::sync::atomic::AtomicUsize>,
}

impl Recorder {
    fn published(&self) -> Vec<Envelope> {
        self.published.lock().unwrap().clone()
    }

    /// The aggregate sequences published, per aggregate, in the order they were published.
    fn sequences(&self) -> BTreeMap<String, Vec<i64>> {
        let mut sequences: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for envelope in self.published() {
            let headers = envelope.headers();
            let aggregate = headers[inbox::outbox::AGGREGATE_ID].clone();
            let sequence = headers[inbox::outbox::AGGREGATE_SEQUENCE].parse().unwrap();
            sequences.entry(aggregate).or_default().push(sequence);
        }
        sequences
    }
}

impl Sink for Recorder {
    fn publish<'a>(
        &'a self,
        _destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            self.asked
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2_000))).await;
            if self.unavailable {
                return Err(SinkError::unavailable("connection refused"));
            }
            if self.refuse == Some(envelope.message_type()) {
                return Err(SinkError::Refused("no stream takes this subject".into()));
            }
            let count = {
                let mut published = self.published.lock().unwrap();
                published.push(envelope.clone());
                published.len()
            };
            if self.stall_after.is_some_and(|limit| count >= limit) {
                self.stalled.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

macro_rules! outbox_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::time::Duration;

        use inbox::outbox::{self, OutboxStatus, Outgoing, Relay};
        use inbox::prelude::*;
        use inbox::{Batch, MemoryBroker, RetryPolicy};

        use super::{Receipt, Recorder};
        use crate::common::ledger::Credited;

        $crate::common::queries::ledger_queries!($db, $connect);

        /// Credits nothing: publishes a receipt, then fails if the amount is negative.
        #[inbox_handler(key = "event_id", aggregate = "account")]
        async fn issue_receipt(ctx: &mut Context<'_, $db>, msg: Credited) -> Result<(), HandlerError> {
            let receipt = Receipt {
                receipt_id: format!("receipt-{}", msg.event_id),
                account: msg.account.clone(),
                number: msg.sequence,
            };
            ctx.publish(&receipt).await?;
            if msg.amount < 0 {
                return Err(HandlerError::msg("a negative credit"));
            }
            Ok(())
        }

        /// Records each receipt it receives once, keyed by its id.
        #[inbox_handler(key = "receipt_id")]
        async fn file_receipt(tx: &mut $conn, msg: Receipt) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO audit_log (event_id, amount) VALUES ($1, $2)"))
                .bind(msg.receipt_id)
                .bind(msg.number)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }

        /// Writes `count` messages of each of `aggregates`, one transaction per message,
        /// interleaving the aggregates.
        async fn write_messages(pool: &Pool, aggregates: usize, count: i64) {
            write_more(pool, aggregates, 1..=count).await
        }

        /// Writes, in one transaction, a message the tests refuse (`test.poison`, of `acct-1`),
        /// then receipt `number` of `account`.
        async fn write_poison_then(pool: &Pool, account: &str, number: i64) {
            let mut tx = pool.begin().await.unwrap();
            outbox::publish(&mut *tx, Outgoing::new("test.poison", b"{}".to_vec()).aggregate("acct-1")).await.unwrap();
            let receipt = Receipt { receipt_id: format!("r-{number}"), account: account.into(), number };
            outbox::publish(&mut *tx, &receipt).await.unwrap();
            tx.commit().await.unwrap();
        }

        /// Writes the messages `numbers` of each of `aggregates`, like [`write_messages`].
        async fn write_more(pool: &Pool, aggregates: usize, numbers: std::ops::RangeInclusive<i64>) {
            for number in numbers {
                for aggregate in 0..aggregates {
                    let account = format!("acct-{aggregate}");
                    let receipt = Receipt { receipt_id: format!("{account}-{number}"), account, number };
                    let mut tx = <$db as inbox::Backend>::begin(pool).await.unwrap();
                    outbox::publish(&mut tx, &receipt).await.unwrap();
                    tx.commit().await.unwrap();
                }
            }
        }

        /// Asserts that of [`write_poison_then`]'s messages only the receipt was published, and
        /// the poison message is kept failed with an error that says `reason`.
        async fn poison_refused_alone(pool: &Pool, recorder: &Recorder, reason: &str) {
            let types: Vec<_> = recorder.published().iter().map(|e| e.message_type().to_owned()).collect();
            assert_eq!(types, ["test.receipt"]);
            let failed = outbox::list(pool, Some(OutboxStatus::Failed), 10).await.unwrap();
            assert_eq!(failed.len(), 1, "{failed:?}");
            assert!(failed[0].last_error.as_deref().unwrap().contains(reason), "{failed:?}");
        }

        async fn relay_all(relay: &Relay<$db, Recorder>) {
            for _ in 0..1_000 {
                if relay.publish_batch().await.unwrap().claimed == 0 {
                    return;
                }
            }
            panic!("the relay never ran out of messages");
        }

        #[tokio::test]
        async fn a_rolled_back_handler_publishes_nothing_and_a_committed_one_publishes_once() {
            let Some(pool) = ledger("outbox_rollback").await else { return };
            for (mode, batch) in [("single", None), ("batched", Some(Batch::new(8)))] {
                let broker = MemoryBroker::new();
                let good = Credited::new(format!("{mode}-good"), format!("{mode}-a"), 1, 5);
                let bad = Credited::new(format!("{mode}-bad"), format!("{mode}-b"), 1, -5);
                for credit in [&good, &bad] {
                    broker.publish(Envelope::encode(&credit.event_id, credit).unwrap().with_header(outbox::CORRELATION_ID, "checkout-7"));
                }
                broker.close();
                let inbox = $crate::common::builder(&pool, batch)
                    .handler(issue_receipt)
                    .retry(RetryPolicy::new(1))
                    .build()
                    .await
                    .unwrap();
                inbox.run(broker.source()).await.unwrap();

                let recorder = Recorder::default();
                relay_all(&Relay::new(pool.clone(), recorder.clone())).await;
                let published: Vec<_> = recorder.published().into_iter()
                    .filter(|envelope| envelope.payload().windows(mode.len()).any(|w| w == mode.as_bytes()))
                    .collect();
                assert_eq!(published.len(), 1, "{mode}: only the committed handler's receipt is published");
                let receipt: Receipt = published[0].decode().unwrap();
                assert_eq!(receipt.receipt_id, format!("receipt-{mode}-good"));
                let headers = published[0].headers();
                assert_eq!(headers[outbox::CORRELATION_ID], "checkout-7", "{mode}: the correlation id is carried");
                assert_eq!(headers[outbox::CAUSATION_ID], good.event_id, "{mode}: caused by the handled message");
                assert_eq!(headers[outbox::AGGREGATE_ID], good.account, "{mode}: the message's own aggregate");
            }
        }

        #[tokio::test]
        async fn an_application_transaction_publishes_what_it_commits_under_the_outbox_id() {
            let Some(pool) = ledger("outbox_application").await else { return };
            let mut tx = pool.begin().await.unwrap();
            outbox::publish(&mut *tx, Outgoing::new("test.ghost", b"{}".to_vec())).await.unwrap();
            let split = Outgoing::new("test.bad", b"{}".to_vec()).with_header("trace", "a\r\nb: c");
            let refused = outbox::publish(&mut *tx, split).await.unwrap_err();
            assert!(refused.to_string().contains("header `trace` cannot be carried"), "{refused}");
            tx.rollback().await.unwrap();
            let mut tx = pool.begin().await.unwrap();
            let raw = Envelope::new("test.raw", "ignored", b"raw bytes".to_vec()).with_header("tenant", "acme");
            let raw_id = outbox::publish(&mut *tx, raw).await.unwrap();
            let typed = Receipt { receipt_id: "r-1".into(), account: "acct-1".into(), number: 1 };
            let typed_id = outbox::publish(&mut *tx, &typed).await.unwrap();
            tx.commit().await.unwrap();

            let broker = MemoryBroker::new();
            let relay = Relay::new(pool.clone(), broker.clone());
            assert_eq!(relay.publish_batch().await.unwrap().published, 2);
            assert_eq!(relay.publish_batch().await.unwrap().claimed, 0, "published messages are not claimed again");
            broker.close();
            let mut source = broker.source();
            let first = inbox::Source::next(&mut source).await.unwrap().unwrap();
            let second = inbox::Source::next(&mut source).await.unwrap().unwrap();
            assert_eq!((first.envelope().id(), first.envelope().payload()), (raw_id.as_str(), &b"raw bytes"[..]));
            assert_eq!(first.envelope().headers()["tenant"], "acme");
            assert_eq!(second.envelope().id(), typed_id);
            assert_eq!(second.envelope().decode::<Receipt>().unwrap(), typed);
            assert_eq!(second.envelope().headers()[outbox::AGGREGATE_SEQUENCE], "1");
            let backlog = outbox::backlog(&pool).await.unwrap();
            assert_eq!((backlog.pending, backlog.failed, backlog.oldest_created_at_ms), (0, 0, None));
        }

        #[tokio::test]
        async fn a_relay_that_dies_before_marking_publishes_again_and_the_inbox_drops_the_copy() {
            let Some(pool) = ledger("outbox_crash").await else { return };
            write_messages(&pool, 3, 1).await;
            let dying = Recorder { stall_after: Some(2), ..Recorder::default() };
            // Long enough that the checks below run well inside it, however slow the machine.
            let lease = Duration::from_secs(3);
            let relay = Relay::new(pool.clone(), dying.clone()).lease(lease);
            let batch = tokio::spawn(async move { relay.publish_batch().await });
            dying.stalled.notified().await;
            batch.abort();
            assert!(batch.await.unwrap_err().is_cancelled());
            assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 3, "the dead relay marked nothing");
            let early = Relay::new(pool.clone(), Recorder::default());
            assert_eq!(early.publish_batch().await.unwrap().claimed, 0, "the dead relay's lease holds");
            tokio::time::sleep(lease).await;

            let recorder = Recorder::default();
            relay_all(&Relay::new(pool.clone(), recorder.clone())).await;
            let mut outcomes = Vec::new();
            for envelope in dying.published().into_iter().chain(recorder.published()) {
                let receipt: Receipt = envelope.decode().unwrap();
                outcomes.push(file_receipt.process(&pool, receipt).await.unwrap());
            }
            let count = |outcome| outcomes.iter().filter(|o| **o == outcome).count();
            assert!(dying.published().len() >= 2, "the dead relay had published before it died");
            assert_eq!(count(Outcome::Processed), 3, "each message is handled once");
            assert_eq!(count(Outcome::Duplicate), dying.published().len(), "each copy is a duplicate");
        }

        #[tokio::test]
        async fn two_relays_never_reorder_an_aggregate() {
            let Some(pool) = ledger("outbox_two_relays").await else { return };
            let (aggregates, count) = (3, 20);
            // Half written before the relays start, half while they run.
            write_messages(&pool, aggregates, count / 2).await;
            let writer = {
                let pool = pool.clone();
                tokio::spawn(async move { write_more(&pool, aggregates, count / 2 + 1..=count).await })
            };
            let recorder = Recorder::default();
            let relays = [pool.clone(), second_pool(&pool).await].map(|pool| {
                let relay = Relay::new(pool, recorder.clone()).batch_size(8).poll_interval(Duration::from_millis(5));
                let stop = published_all(&recorder, aggregates * count as usize);
                tokio::spawn(relay.run(stop))
            });
            writer.await.unwrap();
            let mut published = 0;
            for relay in relays {
                let report = tokio::time::timeout(Duration::from_secs(60), relay).await.unwrap().unwrap();
                published += report.published;
            }
            assert_eq!(published, (aggregates * count as usize) as u64, "each message is published once");
            let expected: Vec<i64> = (1..=count).collect();
            for (aggregate, sequences) in recorder.sequences() {
                assert_eq!(sequences, expected, "{aggregate} is published in the order it was written");
            }
        }

        /// Resolves once `recorder` has seen `total` publications.
        fn published_all(recorder: &Recorder, total: usize) -> impl std::future::Future<Output = ()> + Send + 'static {
            let recorder = recorder.clone();
            async move {
                while recorder.published().len() < total {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }

        #[tokio::test]
        async fn a_refused_message_is_kept_with_its_error_and_holds_back_its_aggregate_until_retried() {
            let Some(pool) = ledger("outbox_refused").await else { return };
            write_poison_then(&pool, "acct-1", 2).await;

            let quick = RetryPolicy::new(2).backoff(Duration::from_millis(1), Duration::from_millis(1));
            let down = Recorder { unavailable: true, ..Recorder::default() };
            let relay = Relay::new(pool.clone(), down.clone()).retry(quick);
            for _ in 0..4 {
                relay.publish_batch().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let waiting = outbox::list(&pool, None, 10).await.unwrap();
            assert_eq!(waiting[0].status, OutboxStatus::Pending, "an unreachable broker is never given up on");
            assert!(waiting[0].attempts >= 2);

            let refusing = Recorder { refuse: Some("test.poison"), ..Recorder::default() };
            let relay = Relay::new(pool.clone(), refusing.clone()).retry(quick);
            relay.publish_batch().await.unwrap();
            let refused_once = outbox::list(&pool, None, 10).await.unwrap();
            let first = &refused_once[0];
            assert_eq!(
                (first.status, first.refusals, first.attempts),
                (OutboxStatus::Pending, 1, waiting[0].attempts + 1),
                "the outage's tries spend none of the budget of refusals (2): {refused_once:?}"
            );
            for _ in 0..4 {
                relay.publish_batch().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let failed = outbox::list(&pool, Some(OutboxStatus::Failed), 10).await.unwrap();
            assert_eq!(failed.len(), 1, "the refused message is kept");
            assert_eq!(failed[0].message_type, "test.poison");
            assert!(failed[0].last_error.as_deref().unwrap().contains("no stream takes this subject"));
            assert!(refusing.published().is_empty(), "its aggregate's later message waits behind it");
            assert_eq!(outbox::backlog(&pool).await.unwrap().failed, 1);

            assert_eq!(outbox::retry(&pool, Some(&failed[0].id)).await.unwrap(), 1);
            let healthy = Recorder::default();
            relay_all(&Relay::new(pool.clone(), healthy.clone())).await;
            let types: Vec<_> = healthy.published().iter().map(|e| e.message_type().to_owned()).collect();
            assert_eq!(types, ["test.poison", "test.receipt"], "retried, then its follower, in order");
        }

        /// A broker that takes none of a batch makes the relay wait, longer each time, though
        /// more messages are due: it does not go on at once through a backlog the broker is
        /// refusing connections for (here each message is due again 1 ms after it failed).
        #[tokio::test]
        async fn a_relay_whose_broker_takes_nothing_backs_off() {
            let Some(pool) = ledger("outbox_backs_off").await else { return };
            write_messages(&pool, 30, 1).await;
            let quick = RetryPolicy::new(5).backoff(Duration::from_millis(1), Duration::from_millis(1));
            let down = Recorder { unavailable: true, ..Recorder::default() };
            let relay = Relay::new(pool.clone(), down.clone()).retry(quick).batch_size(10);

            relay.run(tokio::time::sleep(Duration::from_secs(1))).await;

            let asked = down.asked.load(std::sync::atomic::Ordering::Relaxed);
            // Batches after 0, 100, 300 and 700 ms: 40 publications; at once, thousands.
            assert!((10..=60).contains(&asked), "asked {asked} times in 1 s");
        }

        /// A route that panics on a message refuses that message: it is kept, failed, with the
        /// reason, and the relay goes on publishing the others.
        #[tokio::test]
        async fn a_route_that_panics_refuses_its_message_and_the_relay_goes_on() {
            let Some(pool) = ledger("outbox_route_panics").await else { return };
            write_poison_then(&pool, "acct-2", 1).await;
            let recorder = Recorder::default();
            let relay = Relay::new(pool.clone(), recorder.clone())
                .retry(RetryPolicy::new(1))
                .route(|message| match message.message_type.as_str() {
                    "test.poison" => panic!("no route for {}", message.message_type),
                    other => format!("events.{other}"),
                });

            relay.publish_batch().await.unwrap();

            poison_refused_alone(&pool, &recorder, "panicked").await;
        }

        /// Claims take due messages in the order they fell due: a message refused and due again
        /// at once (a destination that keeps failing) waits behind those that fell due before it,
        /// so it cannot keep the relay from the messages written after it.
        #[tokio::test]
        async fn a_message_that_keeps_failing_does_not_hold_back_the_messages_written_after_it() {
            let Some(pool) = ledger("outbox_due_order").await else { return };
            write_poison_then(&pool, "acct-2", 1).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            let at_once = RetryPolicy::new(100).backoff(Duration::ZERO, Duration::ZERO);
            let refusing = Recorder { refuse: Some("test.poison"), ..Recorder::default() };
            let relay = Relay::new(pool.clone(), refusing.clone()).retry(at_once).batch_size(1);

            for _ in 0..3 {
                relay.publish_batch().await.unwrap();
            }

            let types: Vec<_> = refusing.published().iter().map(|e| e.message_type().to_owned()).collect();
            assert_eq!(types, ["test.receipt"], "the message written after the refused one is published");
        }

        /// A relay whose lease ran out while it waited for the broker, and whose message another
        /// relay claimed since, cannot mark a failure over that claim: the new lease stands, and
        /// the refusal counts nothing. Its confirmed publication counts. A NUL in an error's text
        /// is stored escaped (PostgreSQL's text refuses it; refused, it would undo the batch's
        /// marks).
        #[tokio::test]
        async fn a_late_failure_leaves_another_relays_claim_alone_and_a_late_confirm_counts() {
            use inbox::storage::outbox as rows;
            let Some(pool) = ledger("outbox_late_marks").await else { return };
            write_messages(&pool, 1, 1).await;
            let now = 4_000_000_000_000_i64;
            let claim = |at: i64| {
                let pool = pool.clone();
                async move {
                    let mut tx = <$db as inbox::Backend>::begin(&pool).await.unwrap();
                    let claimed = rows::claim::<$db>(&mut *tx, at, at + 10, 10).await.unwrap();
                    tx.commit().await.unwrap();
                    claimed
                }
            };
            let first = claim(now).await;
            let second = claim(now + 20).await;
            assert_eq!((first.len(), second.len()), (1, 1), "claimed again once the lease ran out");

            let mut tx = <$db as inbox::Backend>::begin(&pool).await.unwrap();
            rows::mark_failed::<$db>(&mut *tx, &first[0], "late\0refusal", true, None).await.unwrap();
            tx.commit().await.unwrap();
            let kept = &outbox::list(&pool, None, 10).await.unwrap()[0];
            assert_eq!(
                (kept.status, kept.refusals, kept.due_at_ms),
                (OutboxStatus::Pending, 0, now + 30),
                "the second claim stands: {kept:?}"
            );

            let mut tx = <$db as inbox::Backend>::begin(&pool).await.unwrap();
            rows::mark_failed::<$db>(&mut *tx, &second[0], "refused\0here", true, None).await.unwrap();
            rows::mark_published::<$db>(&mut *tx, first[0].position, now + 40).await.unwrap();
            tx.commit().await.unwrap();
            let published = outbox::list(&pool, Some(OutboxStatus::Published), 10).await.unwrap();
            assert_eq!(published.len(), 1, "the first relay's confirmed publication counts");
            assert_eq!(published[0].last_error, None);
        }

        /// A message whose stored headers do not decode (a hand edit of the table) is refused and
        /// kept with the reason; it neither stops the claims nor the other messages.
        #[tokio::test]
        async fn a_message_whose_stored_headers_do_not_decode_is_refused_and_the_relay_goes_on() {
            let Some(pool) = ledger("outbox_bad_headers").await else { return };
            write_poison_then(&pool, "acct-2", 1).await;
            let edit = "UPDATE inbox_outbox SET headers = 'not json' WHERE message_type = 'test.poison'";
            sqlx::query(edit).execute(&pool).await.unwrap();
            let recorder = Recorder::default();
            let relay = Relay::new(pool.clone(), recorder.clone()).retry(RetryPolicy::new(1));

            relay.publish_batch().await.unwrap();

            poison_refused_alone(&pool, &recorder, "stored headers").await;
        }

        /// The relay's wake-ups (PostgreSQL's `LISTEN`) hold a connection of their own, not one of
        /// the pool the relay publishes from: a pool of one connection still publishes.
        #[tokio::test]
        async fn a_relay_on_a_pool_of_one_connection_publishes() {
            let Some(pool) = ledger("outbox_one_connection").await else { return };
            let options = (*pool.connect_options()).clone();
            let one = sqlx::pool::PoolOptions::<$db>::new().max_connections(1);
            let one = one.acquire_timeout(Duration::from_secs(5)).connect_with(options).await.unwrap();
            write_messages(&one, 1, 1).await;
            let recorder = Recorder::default();

            Relay::new(one.clone(), recorder.clone()).run(tokio::time::sleep(Duration::from_secs(1))).await;

            assert_eq!(recorder.published().len(), 1);
        }

        #[tokio::test]
        async fn a_running_relay_deletes_published_messages_past_its_retention_and_keeps_the_rest() {
            let Some(pool) = ledger("outbox_retention").await else { return };
            write_messages(&pool, 1, 1).await;
            relay_all(&Relay::new(pool.clone(), Recorder::default())).await;
            write_messages(&pool, 1, 1).await;
            tokio::time::sleep(Duration::from_millis(5)).await;

            let down = Recorder { unavailable: true, ..Recorder::default() };
            let relay = Relay::new(pool.clone(), down).retention(Duration::ZERO);
            relay.run(tokio::time::sleep(Duration::from_millis(200))).await;
            let published = outbox::list(&pool, Some(OutboxStatus::Published), 10).await.unwrap();
            assert!(published.is_empty(), "the published message is past its retention");
            let pending = outbox::list(&pool, None, 10).await.unwrap();
            assert_eq!(pending.len(), 1, "the unpublished one is kept");
        }

        /// A relay whose retention is shorter than an hour looks for messages past it once per
        /// window: what it publishes during its run is deleted during its run.
        #[tokio::test]
        async fn a_short_retention_deletes_what_the_relay_published_during_its_run() {
            let Some(pool) = ledger("outbox_short_retention").await else { return };
            let recorder = Recorder::default();
            let relay = Relay::new(pool.clone(), recorder.clone()).retention(Duration::from_millis(100));
            let run = tokio::spawn(relay.run(tokio::time::sleep(Duration::from_secs(3))));
            tokio::time::sleep(Duration::from_millis(300)).await;

            write_messages(&pool, 1, 3).await;

            run.await.unwrap();
            assert_eq!(recorder.published().len(), 3, "published during the run");
            let published = outbox::list(&pool, Some(OutboxStatus::Published), 10).await.unwrap();
            assert!(published.is_empty(), "deleted past the window: {published:?}");
        }
    };
}

common::on_every_backend!(outbox_suite);

/// A message published outside a transaction (on the pool) is counted in its aggregate and
/// stored in one transaction: when it cannot be stored, its aggregate's count is as it was, so a
/// later message's place is not one the relay could publish before an earlier writer's.
#[tokio::test]
async fn a_message_published_outside_a_transaction_is_counted_only_if_stored() {
    use inbox::outbox::{self, Outgoing};

    let pool = common::sqlite("outbox_outside_a_transaction")
        .await
        .expect("SQLite");
    let refuse = "CREATE TRIGGER refuse BEFORE INSERT ON inbox_outbox \
        WHEN NEW.message_type = 'test.refused' BEGIN SELECT RAISE(ABORT, 'refused'); END";
    sqlx::query(refuse).execute(&pool).await.unwrap();

    let refused = Outgoing::new("test.refused", b"{}".to_vec()).aggregate("acct-1");
    let error = outbox::publish(&pool, refused).await.unwrap_err();
    let stored = Outgoing::new("test.stored", b"{}".to_vec()).aggregate("acct-1");
    outbox::publish(&pool, stored).await.unwrap();

    assert!(error.to_string().contains("refused"), "{error}");
    let messages = outbox::list(&pool, None, 10).await.unwrap();
    let places: Vec<_> = messages.iter().map(|m| m.aggregate_sequence).collect();
    assert_eq!(places, [Some(1)], "the refused message took no place");
}
