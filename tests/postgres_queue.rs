//! The PostgreSQL queue beyond the conformance suite (tests/brokers.rs): with the inbox in the same
//! database, a message whose handling committed is deleted with it and never delivered again;
//! consumers in two processes take an aggregate's messages in the order they were enqueued; a
//! rollback enqueues nothing; a consumer wakes when a message is enqueued, not at its next poll;
//! a row it cannot read is kept as rejected; a consumer whose connections are cut goes on.
//! Runs when `INBOX_TEST_POSTGRES_URL` is set (required under `CI=true`).

mod common;

use std::time::Duration;

use futures::future::BoxFuture;
use inbox::postgres_queue::{PgQueueSource, enqueue};
use inbox::prelude::*;
use inbox::{Acknowledge, Delivery, Source, SourceError};

use common::ledger::Credited;

common::ledger::ledger_handlers!(sqlx::Postgres, sqlx::PgConnection);
common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

/// A consumer of `queue` that claims for `visibility` and polls every 100 ms.
async fn consumer(pool: &Pool, queue: &str, visibility: Duration) -> PgQueueSource {
    PgQueueSource::builder(pool, queue)
        .visibility_timeout(visibility)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .expect("build the source")
}

/// `event` as an envelope in its account's aggregate.
fn envelope(event: &Credited) -> Envelope {
    Envelope::encode(format!("delivery-{}", event.event_id), event)
        .expect("encode")
        .with_header(inbox::outbox::AGGREGATE_ID, event.account.as_str())
}

/// Enqueues `events` to `queue`, each on its own.
async fn enqueue_all(pool: &Pool, queue: &str, events: &[Credited]) {
    for event in events {
        enqueue(pool, queue, &envelope(event))
            .await
            .expect("enqueue");
    }
}

/// The next delivery within `wait`, if one comes.
async fn next_within<S: Source>(source: &mut S, wait: Duration) -> Option<Delivery> {
    match tokio::time::timeout(wait, source.next()).await {
        Ok(next) => next.expect("the source answers"),
        Err(_) => None,
    }
}

/// Rows left in the queue table.
async fn queued(pool: &Pool) -> i64 {
    let rows = sqlx::query_scalar("SELECT COUNT(*) FROM inbox_queue");
    rows.fetch_one(pool).await.expect("count queued rows")
}

/// A source whose deliveries are never settled: a consumer that dies after each commit, before
/// it acknowledges.
struct NeverSettled(PgQueueSource);

/// Settles nothing.
struct Forgotten;

impl Acknowledge for Forgotten {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }

    fn nack(self: Box<Self>, _delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }
}

impl Source for NeverSettled {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        let Some(delivery) = self.0.next().await? else {
            return Ok(None);
        };
        let (envelope, attempt) = (delivery.envelope().clone(), delivery.attempt());
        drop(delivery);
        Ok(Some(Delivery::new(envelope, attempt, Box::new(Forgotten))))
    }
}

#[tokio::test]
async fn a_message_whose_handling_committed_is_never_delivered_again() {
    never_delivered_again_after_commit(None).await;
}

#[tokio::test]
async fn a_message_whose_batch_committed_is_never_delivered_again() {
    never_delivered_again_after_commit(Some(inbox::Batch::new(10))).await;
}

/// Three messages handled by a consumer that dies after each commit, one per transaction or in
/// `batch`: none of them comes back.
async fn never_delivered_again_after_commit(batch: Option<inbox::Batch>) {
    let Some(pool) = ledger("queue_in_guard").await else {
        return;
    };
    let events: Vec<_> = (1..=3)
        .map(|n| Credited::new(format!("e-{n}"), format!("acct-{n}"), 1, n))
        .collect();
    enqueue_all(&pool, "billing", &events).await;
    let visibility = Duration::from_millis(300);
    let builder = Inbox::builder(pool.clone()).handler(credit);
    let builder = match batch {
        Some(batch) => builder.batch(batch),
        None => builder,
    };
    let inbox = builder.build().await.unwrap();

    let dying = NeverSettled(consumer(&pool, "billing", visibility).await);
    let report = run_until_applied(&inbox, &pool, dying, 3).await;
    tokio::time::sleep(visibility * 2).await;

    assert_eq!(
        report.handler_calls_with(Outcome::Processed),
        3,
        "{report:?}"
    );
    assert_eq!(queued(&pool).await, 0, "deleted with the handlers' writes");
    let mut next = consumer(&pool, "billing", visibility).await;
    let again = next_within(&mut next, visibility * 3).await;
    assert!(again.is_none(), "delivered again: {again:?}");
}

#[tokio::test]
async fn a_message_two_handlers_take_stays_queued_until_it_is_acknowledged() {
    let Some(pool) = ledger("queue_two_handlers").await else {
        return;
    };
    enqueue_all(&pool, "billing", &[Credited::new("e-1", "acct", 1, 5)]).await;
    let visibility = Duration::from_millis(300);
    let inbox = Inbox::builder(pool.clone())
        .handler(credit)
        .handler(audit)
        .build()
        .await
        .unwrap();

    let dying = NeverSettled(consumer(&pool, "billing", visibility).await);
    run_until_applied(&inbox, &pool, dying, 1).await;

    // Each handler commits on its own: the first commit must not take the row the second one
    // may still need.
    assert_eq!(
        queued(&pool).await,
        1,
        "the row went with one handler's commit"
    );
    let mut next = consumer(&pool, "billing", visibility).await;
    let again = next_within(&mut next, Duration::from_secs(5)).await;
    assert!(
        again.is_some(),
        "not delivered again after the claim lapsed"
    );
}

#[tokio::test]
async fn two_consumers_take_an_aggregates_messages_in_the_order_they_were_enqueued() {
    let Some(pool) = ledger("queue_order").await else {
        return;
    };
    let (accounts, per_account) = (16, 10);
    let events: Vec<_> = (1..=per_account)
        .flat_map(|sequence| {
            (0..accounts).map(move |account| {
                let id = format!("acct-{account}-{sequence}");
                Credited::new(id, format!("acct-{account}"), sequence, sequence)
            })
        })
        .collect();
    let other = second_pool(&pool).await;
    let build = |pool: &Pool| {
        Inbox::builder(pool.clone())
            .handler(credit)
            .workers(4)
            .build()
    };
    let (one, two) = (build(&pool).await.unwrap(), build(&other).await.unwrap());
    // Each claim takes a few aggregates' heads, so that both consumers find some.
    let claiming = |pool: &Pool| PgQueueSource::builder(pool, "ledger").count(4).build();
    let total = accounts * per_account;

    let (source_one, source_two) = (claiming(&pool).await, claiming(&other).await);

    // Enqueued while both consumers run, a transaction per round of sequences, so that both
    // are woken to take what comes while an aggregate's later messages wait behind it.
    let enqueue_rounds = async {
        for round in events.chunks(accounts as usize) {
            let mut tx = pool.begin().await.expect("begin");
            for event in round {
                let enqueued = enqueue(&mut *tx, "ledger", &envelope(event)).await;
                enqueued.expect("enqueue");
            }
            tx.commit().await.expect("commit");
        }
    };
    let (first, second, ()) = tokio::join!(
        run_until_applied(&one, &pool, source_one.unwrap(), total),
        run_until_applied(&two, &other, source_two.unwrap(), total),
        enqueue_rounds,
    );

    // A message handled before its predecessor would make the predecessor stale (monotonic).
    let stale =
        first.handler_calls_with(Outcome::Stale) + second.handler_calls_with(Outcome::Stale);
    assert_eq!(stale, 0, "{first:?} {second:?}");
    for account in 0..accounts {
        let account = format!("acct-{account}");
        let sequences: Vec<i64> = applied(&pool, &account)
            .await
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(
            sequences,
            (1..=per_account).collect::<Vec<_>>(),
            "{account}"
        );
    }
    assert!(
        first.handler_calls_with(Outcome::Processed) > 0
            && second.handler_calls_with(Outcome::Processed) > 0,
        "both consumers took messages: {first:?} {second:?}"
    );
}

/// A consumer's listener holds a connection of its own, outside the pool: a pool of one
/// connection per worker and one more keeps claiming after its workers took theirs.
#[tokio::test]
async fn a_pool_of_a_connection_per_worker_and_one_more_keeps_claiming() {
    let Some(pool) = ledger("queue_small_pool").await else {
        return;
    };
    let options = (*pool.connect_options()).clone();
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(2));
    let small = small.connect_with(options).await.expect("connect");
    let inbox = Inbox::builder(small.clone()).workers(2).handler(credit);
    let inbox = inbox.build().await.unwrap();
    let source = consumer(&small, "billing", Duration::from_secs(30)).await;
    let rounds = async {
        for round in 1..=2 {
            let events: Vec<_> = (1..=4)
                .map(|n| Credited::new(format!("e-{round}-{n}"), format!("acct-{n}"), round, 1))
                .collect();
            enqueue_all(&pool, "billing", &events).await;
            let applied = async {
                while count(&pool, "applied").await < 4 * round {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            let within = tokio::time::timeout(Duration::from_secs(10), applied).await;
            assert!(within.is_ok(), "round {round} was not applied");
        }
    };

    inbox.run_until(source, rounds).await.expect("run");

    assert_eq!(count(&pool, "applied").await, 8);
}

/// What the queue cannot store is refused before any statement, so the caller's transaction,
/// and what else it wrote, still commits.
#[tokio::test]
async fn bad_input_is_refused_without_aborting_the_callers_transaction() {
    let Some(pool) = ledger("queue_bad_input").await else {
        return;
    };
    let sound = Envelope::new("test.credited", "m-1", b"{}".to_vec());
    let long = "x".repeat(600);
    let refused = [
        (
            "billing",
            Envelope::new("test.credited", "m\0id", b"{}".to_vec()),
        ),
        ("billing", sound.clone().with_header("note", "a\0b")),
        (
            "billing",
            sound
                .clone()
                .with_header(inbox::outbox::AGGREGATE_ID, long.as_str()),
        ),
        (long.as_str(), sound.clone()),
    ];
    let mut tx = pool.begin().await.expect("begin");
    enqueue(&mut *tx, "billing", &sound).await.expect("enqueue");

    for (queue, envelope) in &refused {
        let error = enqueue(&mut *tx, queue, envelope).await.unwrap_err();
        assert!(error.to_string().contains("cannot enqueue"), "{error}");
    }
    tx.commit().await.expect("commit");

    assert_eq!(queued(&pool).await, 1, "the sound message, written before");
}

#[tokio::test]
async fn a_rolled_back_transaction_enqueues_nothing() {
    let Some(pool) = ledger("queue_rollback").await else {
        return;
    };
    let (kept, undone) = (
        Credited::new("kept", "acct", 1, 1),
        Credited::new("undone", "acct", 2, 1),
    );
    let mut tx = pool.begin().await.unwrap();
    enqueue(&mut *tx, "billing", &envelope(&undone))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    enqueue(&mut *tx, "billing", &envelope(&kept))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut source = consumer(&pool, "billing", Duration::from_secs(30)).await;
    let delivery = next_within(&mut source, Duration::from_secs(5))
        .await
        .expect("the committed message");
    assert_eq!(delivery.envelope().id(), "delivery-kept");
    assert_eq!(delivery.envelope().headers()["destination"], "billing");
    delivery.ack().await.unwrap();
    assert!(
        next_within(&mut source, Duration::from_millis(500))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_consumer_wakes_when_a_message_is_enqueued_not_at_its_next_poll() {
    let Some(pool) = ledger("queue_wakeup").await else {
        return;
    };
    let mut source = PgQueueSource::builder(&pool, "billing")
        .poll_interval(Duration::from_secs(120))
        .build()
        .await
        .unwrap();
    let publisher = pool.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let event = Credited::new("e-1", "acct", 1, 1);
        enqueue(&publisher, "billing", &envelope(&event))
            .await
            .unwrap();
    });

    // The first claim finds nothing; the notification, not the two-minute poll, brings it.
    let delivery = next_within(&mut source, Duration::from_secs(10)).await;
    assert!(delivery.is_some(), "not woken by the enqueue");
}

/// A row a producer's own SQL wrote at `infinity` is handed out without a time: it neither
/// fails the claim (its time in milliseconds is no number) nor stops the queue.
#[tokio::test]
async fn a_row_enqueued_at_infinity_is_delivered_without_a_time() {
    let Some(pool) = ledger("queue_infinity").await else {
        return;
    };
    let insert = "INSERT INTO inbox_queue (queue, message_id, message_type, payload, headers, \
                  enqueued_at) VALUES ('billing', 'd-1', 'test.credited', $1, '{}', 'infinity')";
    let written = sqlx::query(insert).bind(b"{}".to_vec()).execute(&pool);
    written.await.unwrap();
    let mut source = consumer(&pool, "billing", Duration::from_secs(30)).await;

    let delivery = next_within(&mut source, Duration::from_secs(10)).await;

    let envelope = delivery.expect("delivered").envelope().clone();
    assert_eq!((envelope.id(), envelope.produced_at()), ("d-1", None));
}

#[tokio::test]
async fn a_row_whose_headers_are_not_strings_is_kept_as_rejected() {
    let Some(pool) = ledger("queue_bad_headers").await else {
        return;
    };
    let insert = "INSERT INTO inbox_queue (queue, message_id, message_type, payload, headers) \
                  VALUES ('billing', 'd-1', 'test.credited', $1, '{\"retries\": 3}')";
    sqlx::query(insert)
        .bind(b"{\"raw\": true}".to_vec())
        .execute(&pool)
        .await
        .unwrap();
    let inbox = Inbox::builder(pool.clone())
        .handler(credit)
        .build()
        .await
        .unwrap();
    let source = consumer(&pool, "billing", Duration::from_secs(30)).await;

    let done = async {
        common::eventually_async("the row is settled", || async { queued(&pool).await == 0 }).await;
    };
    inbox.run_until(source, done).await.unwrap();

    let rejected = inbox.rejected().await.unwrap();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].payload, b"{\"raw\": true}");
    assert!(
        rejected[0].reason.contains("not an object of strings"),
        "{}",
        rejected[0].reason
    );
}

#[tokio::test]
async fn a_consumer_whose_connections_are_cut_loses_nothing() {
    let Some(pool) = ledger("queue_cut").await else {
        return;
    };
    let name = common::unique("queue_cut_consumer");
    let options = (*pool.connect_options()).clone().application_name(&name);
    let queue_pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let events: Vec<_> = (1..=40)
        .map(|n| Credited::new(format!("e-{n}"), format!("acct-{}", n % 4), n, 1))
        .collect();
    let (before, after) = events.split_at(20);
    enqueue_all(&pool, "billing", before).await;
    let inbox = Inbox::builder(pool.clone())
        .handler(credit_unsequenced)
        .build()
        .await
        .unwrap();
    let source = consumer(&queue_pool, "billing", Duration::from_secs(1)).await;
    let running = (inbox.clone(), pool.clone());
    let run =
        tokio::spawn(async move { run_until_applied(&running.0, &running.1, source, 40).await });
    common::eventually_async("some applied", || async {
        count(&pool, "applied").await >= 5
    })
    .await;

    let cut = "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
               WHERE application_name = $1";
    let cut: i64 = sqlx::query_scalar(cut)
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(cut > 0, "no connection of the consumer was cut");
    enqueue_all(&pool, "billing", after).await;
    let report = run.await.unwrap();

    assert_eq!(count(&pool, "applied").await, 40, "{report:?}");
    assert_eq!(balance(&pool, "acct-0").await, 10);
}

/// A run stopped while its claim waits on the database takes what that claim claimed once it
/// answers, and hands it back: the row is claimable again at once, not after its visibility
/// timeout.
#[tokio::test]
async fn a_claim_in_flight_when_the_run_stops_is_handed_back_at_once() {
    let Some(pool) = ledger("queue_claim_at_stop").await else {
        return;
    };
    enqueue_all(&pool, "billing", &[Credited::new("e-1", "acct", 1, 1)]).await;
    let inbox = Inbox::builder(pool.clone())
        .handler(credit)
        .build()
        .await
        .unwrap();
    let source = consumer(&pool, "billing", Duration::from_secs(30)).await;
    let mut locked = pool.begin().await.unwrap();
    let lock = "LOCK TABLE inbox_queue IN ACCESS EXCLUSIVE MODE";
    sqlx::query(lock).execute(&mut *locked).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopping = async {
        let _ = stopped.await;
    };
    let running = tokio::spawn(async move { inbox.run_until(source, stopping).await });
    let waiting =
        "SELECT COUNT(*) FROM pg_locks WHERE relation = 'inbox_queue'::regclass AND NOT granted";
    common::eventually_async("the claim waits for the table", || async {
        let waiting = sqlx::query_scalar::<_, i64>(waiting).fetch_one(&pool);
        waiting.await.unwrap() > 0
    })
    .await;

    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    locked.commit().await.unwrap();
    let report = running.await.unwrap().unwrap();

    assert_eq!(
        report.handler_calls_with(Outcome::Processed),
        0,
        "{report:?}"
    );
    let mut again = consumer(&pool, "billing", Duration::from_secs(30)).await;
    let delivery = next_within(&mut again, Duration::from_secs(3)).await;
    let id = delivery.map(|delivery| delivery.envelope().id().to_owned());
    assert_eq!(
        id.as_deref(),
        Some("delivery-e-1"),
        "the row is claimable again"
    );
}
