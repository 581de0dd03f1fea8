//! Failure paths that must neither lose a message, loop, nor bury the wrong one: content hashed
//! over what was delivered, failures recorded per content, the backoff held whoever redelivers,
//! retries owned by the store, failed releases recorded, gaps only where the predecessor is
//! absent, sequences validated at the door, and each handler serialized by its own aggregate.
//! Every test runs on SQLite and, when configured, on PostgreSQL.

mod common;

/// `error` is a first attempt that failed, to be tried again, and says `says` (what to do).
fn assert_first_attempt_failed(error: &inbox::Error, says: &str) {
    let first = matches!(
        error,
        inbox::Error::Handler {
            attempt: 1,
            retry_after: Some(_),
            ..
        }
    );
    assert!(first, "{error}");
    assert!(
        error.to_string().contains(says),
        "the error says what to do: {error}"
    );
}

macro_rules! hardening_suite {
    ($db:ty, $connect:path, $batch:expr) => {
        use std::collections::HashMap;
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{Error, MemoryBroker, RetryPolicy};
        use inbox_core::{Claim, Failure};

        type Pool = sqlx::Pool<$db>;

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        /// A payment whose `kind` says how its handler behaves: `fail-once` fails on its first
        /// attempt, `fail` always, `crash-at-2` fails for sequence 2 while the `blocked` table
        /// holds a row.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "hardening.payment")]
        struct Payment {
            id: String,
            order: String,
            seq: i64,
            kind: String,
            #[serde(default)]
            tags: HashMap<String, i64>,
        }

        /// The same type tag before a deploy added `currency`.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "hardening.payment")]
        struct PaymentV1 {
            id: String,
            order: String,
            seq: i64,
            kind: String,
        }

        /// The type after the deploy.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "hardening.payment")]
        struct PaymentV2 {
            id: String,
            order: String,
            seq: i64,
            kind: String,
            #[serde(default)]
            currency: Option<String>,
        }

        fn payment(id: &str, order: &str, seq: i64, kind: &str) -> Payment {
            Payment { id: id.into(), order: order.into(), seq, kind: kind.into(), tags: HashMap::new() }
        }

        async fn record(ctx: &mut Context<'_, $db>, payment: &Payment) -> Result<(), HandlerError> {
            match payment.kind.as_str() {
                "fail" => return Err(HandlerError::msg("never works")),
                "fail-once" if ctx.attempt() == 1 => return Err(HandlerError::msg("first attempt fails")),
                "impostor-at-2" if payment.seq == 2 => {
                    return Err(HandlerError::permanent(HandlerError::msg("gap timeout at sequence 2")));
                }
                "permanent-at-2" if payment.seq == 2 => {
                    return Err(HandlerError::permanent(HandlerError::msg("sequence 2 is refused")))
                }
                "swallow" => {
                    // Goes on from a failed statement (its id is taken), as if it had worked.
                    let taken = sqlx::query($crate::common::sql::<$db>("INSERT INTO once (id) VALUES ('taken')"));
                    let _ = taken.execute(&mut **ctx).await;
                    return Ok(());
                }
                "crash-at-2" if payment.seq == 2 => {
                    let blocked: i64 = sqlx::query_scalar($crate::common::sql::<$db>("SELECT COUNT(*) FROM blocked")).fetch_one(&mut **ctx).await?;
                    if blocked > 0 {
                        return Err(HandlerError::msg("sequence 2 is blocked"));
                    }
                }
                _ => {}
            }
            sqlx::query($crate::common::sql::<$db>("INSERT INTO applied (handler, id, seq) VALUES ($1, $2, $3)"))
                .bind(ctx.handler())
                .bind(payment.id.clone())
                .bind(payment.seq)
                .execute(&mut **ctx)
                .await?;
            Ok(())
        }

        #[inbox_handler(key = "id", name = "payments")]
        async fn pay(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
            record(ctx, &payment).await
        }

        #[inbox_handler(key = "id", sequence = "seq", aggregate = "order", ordering = "strict", name = "strict")]
        async fn pay_strict(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
            record(ctx, &payment).await
        }

        #[inbox_handler(key = "id", sequence = "seq", aggregate = "order", name = "monotonic")]
        async fn pay_monotonic(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
            record(ctx, &payment).await
        }

        #[inbox_handler(key = "id", name = "versioned")]
        async fn pay_v1(ctx: &mut Context<'_, $db>, payment: PaymentV1) -> Result<(), HandlerError> {
            let payment = Payment { id: payment.id, order: payment.order, seq: payment.seq, kind: payment.kind, tags: HashMap::new() };
            record(ctx, &payment).await
        }

        #[inbox_handler(key = "id", name = "versioned")]
        async fn pay_v2(ctx: &mut Context<'_, $db>, payment: PaymentV2) -> Result<(), HandlerError> {
            let payment = Payment { id: payment.id, order: payment.order, seq: payment.seq, kind: payment.kind, tags: HashMap::new() };
            record(ctx, &payment).await
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            for ddl in [
                "CREATE TABLE applied (handler TEXT NOT NULL, id TEXT NOT NULL, seq BIGINT NOT NULL, position BIGINT)",
                "CREATE TABLE blocked (why TEXT)",
                "CREATE TABLE once (id VARCHAR(64) PRIMARY KEY)",
            ] {
                sqlx::query($crate::common::sql::<$db>(ddl)).execute(&pool).await.unwrap();
            }
            Some(pool)
        }

        fn quick(max_attempts: u32) -> RetryPolicy {
            RetryPolicy::new(max_attempts).backoff(Duration::from_millis(20), Duration::from_millis(50)).jitter(0.0)
        }

        async fn applied(pool: &Pool, handler: &str) -> Vec<String> {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT id FROM applied WHERE handler = $1 ORDER BY id"))
                .bind(handler.to_owned())
                .fetch_all(pool)
                .await
                .unwrap()
        }

        async fn row(pool: &Pool, handler: &str, id: &str) -> Option<(String, i32)> {
            sqlx::query_as($crate::common::sql::<$db>("SELECT status, attempt_count FROM inbox_messages WHERE handler = $1 AND message_id = $2"))
                .bind(handler.to_owned())
                .bind(id.to_owned())
                .fetch_optional(pool)
                .await
                .unwrap()
        }

        /// Dispatches `envelope` once its retry is due, as a broker honouring the delay would.
        async fn dispatch_due(inbox: &Inbox<$db>, envelope: &Envelope) -> Result<inbox::Dispatched, Error> {
            loop {
                match inbox.dispatch(envelope).await {
                    Err(Error::RetryNotDue { retry_after, .. }) => tokio::time::sleep(retry_after).await,
                    other => return other,
                }
            }
        }

        fn envelope<M: inbox::Message>(id: &str, message: &M) -> Envelope {
            Envelope::encode(format!("delivery-{id}"), message).unwrap()
        }

        #[tokio::test]
        async fn a_redelivery_of_a_map_field_is_the_same_content_and_is_retried() {
            let Some(pool) = database("map_content").await else { return };
            let inbox = builder(&pool).retry(quick(5)).handler(pay).build().await.unwrap();
            let mut message = payment("p-1", "o-1", 1, "fail-once");
            message.tags = (0..32).map(|n| (format!("tag-{n}"), n)).collect();
            let delivered = envelope("p-1", &message);

            let first = inbox.dispatch(&delivered).await.unwrap_err();
            assert!(matches!(first, Error::Handler { attempt: 1, .. }), "{first}");
            let retried = dispatch_due(&inbox, &delivered).await.unwrap();

            assert_eq!(retried[0].outcome, Outcome::Processed, "a redelivery of the same bytes is a retry, never a conflict");
            assert_eq!(applied(&pool, "payments").await, ["p-1"]);
            assert_eq!(pay.process(&pool, message.clone()).await.unwrap(), Outcome::Duplicate, "the same value, encoded in another order");
        }

        #[tokio::test]
        async fn a_field_added_by_a_deploy_does_not_make_earlier_deliveries_conflict() {
            let Some(pool) = database("added_field").await else { return };
            let before = builder(&pool).retry(quick(5)).handler(pay_v1).build().await.unwrap();
            let after = builder(&pool).retry(quick(5)).handler(pay_v2).build().await.unwrap();
            let sent = PaymentV1 { id: "p-1".into(), order: "o-1".into(), seq: 1, kind: "fail-once".into() };
            let delivered = envelope("p-1", &sent);

            before.dispatch(&delivered).await.unwrap_err();
            let retried = dispatch_due(&after, &delivered).await.unwrap();

            assert_eq!(retried[0].outcome, Outcome::Processed, "the failed message is retried after the deploy");
            assert_eq!(after.dispatch(&delivered).await.unwrap()[0].outcome, Outcome::Duplicate);
        }

        #[tokio::test]
        async fn a_failure_of_other_content_does_not_overwrite_the_recorded_one() {
            let Some(pool) = database("failure_content").await else { return };
            let inbox = builder(&pool).retry(quick(5)).handler(pay).build().await.unwrap();
            let original = envelope("p-1", &payment("p-1", "o-1", 1, "fail"));
            inbox.dispatch(&original).await.unwrap_err();
            let other_hash = [7u8; 32];
            let claim = Claim {
                consumer: inbox.consumer(),
                handler: "payments",
                message_id: "p-1",
                message_type: "hardening.payment",
                aggregate: None,
                sequence: None,
                payload_hash: &other_hash,
                now_ms: 0,
            };
            let failure = Failure { payload: b"{\"other\": true}", headers: "{}", error: "other content failed" };

            let mut tx = pool.begin().await.unwrap();
            let recorded = inbox::storage::messages::record_failure(&mut tx, &claim, &failure).await.unwrap();
            tx.commit().await.unwrap();

            assert_eq!(recorded, None, "a failure of other content is not recorded over this one");
            let kept = inbox.show("payments", "p-1").await.unwrap().unwrap();
            assert_eq!(kept.payload.as_deref(), Some(original.payload()), "the payload matches the hash kept");
            assert_eq!(kept.attempt_count, 1);
        }

        #[tokio::test]
        async fn a_redelivery_before_the_backoff_runs_nothing_and_counts_no_attempt() {
            let Some(pool) = database("early_redelivery").await else { return };
            let policy = RetryPolicy::new(5).backoff(Duration::from_secs(10), Duration::from_secs(10));
            let inbox = builder(&pool).retry(policy).handler(pay).build().await.unwrap();
            let broker = MemoryBroker::new();
            // Five copies in flight at once: a broker that redelivers at once, or duplicates.
            for _ in 0..5 {
                broker.publish(envelope("p-1", &payment("p-1", "o-1", 1, "fail")));
            }

            // Time to take all five, however slow the machine, and well before the retry is due.
            let report = inbox.run_until(broker.source(), tokio::time::sleep(Duration::from_secs(3))).await.unwrap();

            assert_eq!(row(&pool, "payments", "p-1").await, Some(("failed".into(), 1)), "one attempt, not five: {report:?}");
            assert_eq!(report.not_due, 4, "{report:?}");
        }

        #[tokio::test]
        async fn a_failure_whose_redelivery_never_comes_is_retried_from_the_store() {
            let Some(pool) = database("store_retry").await else { return };
            let inbox = builder(&pool)
                .retry(quick(5))
                .sweep_interval(Duration::from_millis(20))
                .handler(pay)
                .build()
                .await
                .unwrap();
            inbox.dispatch(&envelope("p-1", &payment("p-1", "o-1", 1, "fail-once"))).await.unwrap_err();
            // The broker gave up on it (max deliveries, its own dead-letter queue, an offset moved
            // past it): nothing will ever be redelivered.
            let broker = MemoryBroker::new();
            let done = {
                let pool = pool.clone();
                async move {
                    while applied(&pool, "payments").await.is_empty() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            };

            let run = tokio::time::timeout(Duration::from_secs(20), inbox.run_until(broker.source(), done));
            let report = run.await.expect("the store retries the message").unwrap();

            assert_eq!(row(&pool, "payments", "p-1").await, Some(("processed".into(), 1)), "{report:?}");
            assert_eq!(report.replayed, 1, "{report:?}");
        }

        #[tokio::test]
        async fn a_released_message_that_fails_is_recorded_and_dies_visibly() {
            let Some(pool) = database("failed_release").await else { return };
            let inbox = builder(&pool).retry(quick(3)).handler(pay_strict).build().await.unwrap();
            for seq in [2, 3] {
                let parked = inbox.dispatch(&envelope(&format!("p-{seq}"), &payment(&format!("p-{seq}"), "o-1", seq, "permanent-at-2"))).await.unwrap();
                assert_eq!(parked[0].outcome, Outcome::Parked);
            }

            let first = inbox.dispatch(&envelope("p-1", &payment("p-1", "o-1", 1, "permanent-at-2"))).await.unwrap();

            assert_eq!((first[0].outcome, first[0].released), (Outcome::Processed, 0));
            assert_eq!(row(&pool, "strict", "p-2").await, Some(("dead".into(), 1)), "the release failed like a delivery");
            let dead = inbox.dead().await.unwrap();
            assert_eq!(dead.len(), 1);
            assert_eq!(dead[0].error_text.as_deref(), Some("sequence 2 is refused"));
            assert_eq!(row(&pool, "strict", "p-3").await.unwrap().0, "parked", "its successor waits behind it");
        }

        #[tokio::test]
        async fn skipping_a_gap_revives_only_what_a_gap_timeout_buried() {
            let Some(pool) = database("gap_reason").await else { return };
            let inbox = builder(&pool).handler(pay_strict).build().await.unwrap();
            let delivery = |seq: i64| envelope(&format!("p-{seq}"), &payment(&format!("p-{seq}"), "o-1", seq, "impostor-at-2"));
            inbox.dispatch(&delivery(1)).await.unwrap();
            inbox.dispatch(&delivery(2)).await.unwrap_err();
            assert_eq!(inbox.dispatch(&delivery(4)).await.unwrap()[0].outcome, Outcome::Parked);

            inbox.skip_gap("strict", "o-1").await.unwrap();

            let dead = inbox.show("strict", "p-2").await.unwrap().unwrap();
            assert_eq!((dead.status.as_str(), dead.dead_reason.map(|r| r.as_str())), ("dead", Some("gave_up")), "an error's text is not a reason");
            assert_eq!(applied(&pool, "strict").await, ["p-1", "p-4"]);
        }

        /// An inbox whose strict stream `o-1` applied #1, holds #2 `failed` until its retry an
        /// hour from now (the `blocked` table holds a row), and #`parked` parked behind it.
        async fn behind_a_retry(pool: &Pool, parked: i64) -> Inbox<$db> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO blocked (why) VALUES ('test')")).execute(pool).await.unwrap();
            let hour = Duration::from_secs(3600);
            let inbox = builder(pool).retry(RetryPolicy::new(5).backoff(hour, hour)).handler(pay_strict).build().await.unwrap();
            let delivery = |seq: i64| envelope(&format!("p-{seq}"), &payment(&format!("p-{seq}"), "o-1", seq, "crash-at-2"));
            inbox.dispatch(&delivery(1)).await.unwrap();
            inbox.dispatch(&delivery(2)).await.unwrap_err();
            assert_eq!(inbox.dispatch(&delivery(parked)).await.unwrap()[0].outcome, Outcome::Parked);
            inbox
        }

        #[tokio::test]
        async fn skipping_a_gap_never_skips_a_message_waiting_for_its_retry() {
            let Some(pool) = database("skip_retrying").await else { return };
            let inbox = behind_a_retry(&pool, 4).await;

            let released = inbox.skip_gap("strict", "o-1").await.unwrap();

            assert_eq!(released, 0, "#2 is not missing, it waits for its retry");
            assert_eq!(row(&pool, "strict", "p-2").await.unwrap().0, "failed");
            assert_eq!(row(&pool, "strict", "p-4").await.unwrap().0, "parked");
            let last: i64 = sqlx::query_scalar($crate::common::sql::<$db>("SELECT last_sequence FROM inbox_streams WHERE aggregate_id = 'o-1'"))
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(last, 1, "the stream stops before #2, so its retry applies");
        }

        #[tokio::test]
        async fn a_gap_whose_predecessor_is_retrying_is_not_expired_and_releases_when_it_succeeds() {
            let Some(pool) = database("retrying_gap").await else { return };
            let inbox = behind_a_retry(&pool, 3).await;
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();

            assert_eq!(inbox.expire_gaps().await.unwrap(), [], "#2 is not missing, it waits for its retry");
            let stream = inbox::Stream { consumer: inbox.consumer(), handler: "strict", aggregate: "o-1" };
            let mut tx = pool.begin().await.unwrap();
            let buried = inbox::storage::streams::bury_gap(&mut tx, &stream, 1, 0.0).await.unwrap();
            assert_eq!(buried, None, "checked again under the stream lock");
            tx.rollback().await.unwrap();

            sqlx::query($crate::common::sql::<$db>("DELETE FROM blocked")).execute(&pool).await.unwrap();
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET retry_at_ms = 0 WHERE status = 'failed'")).execute(&pool).await.unwrap();
            assert_eq!(inbox.replay_requested().await.unwrap(), 1);
            assert_eq!(applied(&pool, "strict").await, ["p-1", "p-2", "p-3"], "#3 was released behind #2");
        }

        #[tokio::test]
        async fn a_gap_is_checked_overdue_again_under_the_stream_lock() {
            // The gap an expiry found overdue may have filled before the stream was locked, and
            // a new message parked behind a new gap: that one is fresh, and is spared.
            let Some(pool) = database("fresh_gap_spared").await else { return };
            let inbox = builder(&pool).handler(pay_strict).build().await.unwrap();
            let delivery = |seq: i64| envelope(&format!("p-{seq}"), &payment(&format!("p-{seq}"), "o-1", seq, "none"));
            inbox.dispatch(&delivery(1)).await.unwrap();
            assert_eq!(inbox.dispatch(&delivery(3)).await.unwrap()[0].outcome, Outcome::Parked);

            let stream = inbox::Stream { consumer: inbox.consumer(), handler: "strict", aggregate: "o-1" };
            let mut tx = pool.begin().await.unwrap();
            let buried = inbox::storage::streams::bury_gap(&mut tx, &stream, 1, 3600.0).await.unwrap();
            assert_eq!(buried, None, "#3 parked just now: not an hour ago");
            let buried = inbox::storage::streams::bury_gap(&mut tx, &stream, 1, 0.0).await.unwrap();
            assert_eq!(buried, Some((2, 1)), "overdue at once with no timeout");
            tx.rollback().await.unwrap();
        }

        #[tokio::test]
        async fn gaps_are_not_expired_before_the_run_has_consumed_for_the_timeout() {
            let Some(pool) = database("gap_after_downtime").await else { return };
            #[inbox_handler(key = "id", sequence = "seq", aggregate = "order", ordering = "strict", gap_timeout = "2s", name = "quick_gap")]
            async fn quick_gap(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
                record(ctx, &payment).await
            }
            let inbox = builder(&pool).sweep_interval(Duration::from_millis(20)).handler(quick_gap).build().await.unwrap();
            inbox.dispatch(&envelope("p-2", &payment("p-2", "o-1", 2, "ok"))).await.unwrap();
            // Parked long ago, before the consumer went down.
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();
            let broker = MemoryBroker::new();

            let report = inbox.run_until(broker.source(), tokio::time::sleep(Duration::from_millis(500))).await.unwrap();

            assert_eq!(report.gap_expired, 0, "the missing message may be waiting in the backlog: {report:?}");
            assert_eq!(row(&pool, "quick_gap", "p-2").await.unwrap().0, "parked");
        }

        #[tokio::test]
        async fn an_outage_of_the_source_does_not_count_towards_a_gap_timeout() {
            let Some(pool) = database("gap_over_outage").await else { return };
            #[inbox_handler(key = "id", sequence = "seq", aggregate = "order", ordering = "strict", gap_timeout = "1s", name = "gap_over_outage")]
            async fn gap_over_outage(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
                record(ctx, &payment).await
            }
            /// A transport whose broker is down for a while, then delivers what waited there.
            struct DownAtFirst {
                up_at: std::time::Instant,
                broker: inbox::MemorySource,
            }
            impl inbox::Source for DownAtFirst {
                async fn next(&mut self) -> Result<Option<inbox::Delivery>, inbox::SourceError> {
                    if std::time::Instant::now() < self.up_at {
                        return Err("broker down".into());
                    }
                    self.broker.next().await
                }
            }
            let inbox = builder(&pool).sweep_interval(Duration::from_millis(20)).handler(gap_over_outage).build().await.unwrap();
            inbox.dispatch(&envelope("p-2", &payment("p-2", "o-1", 2, "ok"))).await.unwrap();
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();
            let broker = MemoryBroker::new();
            broker.publish(envelope("p-1", &payment("p-1", "o-1", 1, "ok")));
            broker.close();
            let up_at = std::time::Instant::now() + Duration::from_millis(2_500);

            let run = inbox.run(DownAtFirst { up_at, broker: broker.source() });
            let report = tokio::time::timeout(Duration::from_secs(20), run).await.unwrap().unwrap();

            assert_eq!(report.gap_expired, 0, "the missing message waited at the broker all along: {report:?}");
            assert_eq!(row(&pool, "gap_over_outage", "p-2").await.unwrap().0, "processed");
        }

        #[tokio::test]
        async fn sequences_outside_the_valid_range_are_refused_at_the_door() {
            let Some(pool) = database("sequence_range").await else { return };
            for seq in [i64::MAX, i64::MIN, -1, inbox::MAX_SEQUENCE + 1] {
                let error = pay_monotonic.process(&pool, payment("p", "o-1", seq, "ok")).await.unwrap_err();
                assert!(matches!(error, Error::InvalidIdentity { what: "sequence", .. }), "{seq}: {error}");
            }
            assert_eq!(pay_monotonic.process(&pool, payment("p", "o-1", inbox::MAX_SEQUENCE, "ok")).await.unwrap(), Outcome::Processed);
            let inbox = builder(&pool).handler(pay_strict).build().await.unwrap();
            let broker = MemoryBroker::new();
            for (n, seq) in [0, i64::MAX].into_iter().enumerate() {
                broker.publish(envelope(&format!("bad-{n}"), &payment(&format!("bad-{n}"), "o-2", seq, "ok")));
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!((report.rejected, broker.acked(), broker.redelivered()), (2, 2, 0), "{report:?}");
            assert_eq!(inbox.rejected().await.unwrap().len(), 2);
        }

        #[tokio::test]
        async fn an_unavailable_database_is_retried_with_growing_delays_not_in_a_loop() {
            let Some(pool) = database("unavailable").await else { return };
            let inbox = builder(&pool).handler(pay).build().await.unwrap();
            let broker = MemoryBroker::new();
            broker.publish(envelope("p-1", &payment("p-1", "o-1", 1, "ok")));
            pool.close().await;

            let report = inbox.run_until(broker.source(), tokio::time::sleep(Duration::from_millis(1_000))).await.unwrap();

            assert!(broker.redelivered() <= 5, "handed back {} times in a second", broker.redelivered());
            assert_eq!(report.acked, 0, "nothing is acknowledged that was not recorded");
        }

        #[tokio::test]
        async fn a_handler_past_its_attempt_timeout_has_failed_and_lets_go_of_its_locks() {
            let Some(pool) = database("attempt_timeout").await else { return };
            #[inbox_handler(key = "id", sequence = "seq", aggregate = "order", name = "hangs")]
            async fn hangs(ctx: &mut Context<'_, $db>, payment: Payment) -> Result<(), HandlerError> {
                if payment.kind == "hang" {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                record(ctx, &payment).await
            }
            // Ample for p-2's own writes on a loaded machine; the hanging handler still times out.
            let policy = quick(3).attempt_timeout(Duration::from_secs(1));
            let inbox = builder(&pool).retry(policy).handler(hangs).build().await.unwrap();

            let error = inbox.dispatch(&envelope("p-1", &payment("p-1", "o-1", 1, "hang"))).await.unwrap_err();

            assert!(matches!(error, Error::Handler { attempt: 1, retry_after: Some(_), .. }), "{error}");
            assert!(error.to_string().contains("timed out"), "{error}");
            let next = inbox.dispatch(&envelope("p-2", &payment("p-2", "o-1", 2, "ok"))).await.unwrap();
            assert_eq!(next[0].outcome, Outcome::Processed, "the aggregate's lock was let go");
        }

        /// An error that says a connection was lost, while the inbox's own connection answers
        /// (a second pool closed, a `dblink` to a server that is down), is the handler's failure:
        /// recorded and retried within the policy, not handed back without end.
        #[tokio::test]
        async fn a_lost_connection_that_is_not_the_inboxs_is_the_handlers_failure() {
            let Some(pool) = database("lost_elsewhere").await else { return };
            #[inbox_handler(key = "id", name = "elsewhere")]
            async fn elsewhere(_payment: Payment) -> Result<(), HandlerError> {
                Err(sqlx::Error::PoolClosed.into())
            }
            let inbox = builder(&pool).retry(quick(3)).handler(elsewhere).build().await.unwrap();

            let error = inbox.dispatch(&envelope("p-1", &payment("p-1", "o-1", 1, "ok"))).await.unwrap_err();

            assert!(matches!(error, Error::Handler { attempt: 1, retry_after: Some(_), .. }), "{error}");
            assert!(error.to_string().contains("closed pool"), "{error}");
            assert_eq!(row(&pool, "elsewhere", "p-1").await.unwrap().0, "failed");
        }

        #[tokio::test]
        async fn a_long_release_chain_stops_to_let_the_delivery_settle_and_a_sweep_finishes_it() {
            let Some(pool) = database("bounded_chain").await else { return };
            let inbox = builder(&pool).handler(pay_strict).build().await.unwrap();
            let chain = i64::from(inbox::RELEASES_PER_MESSAGE) + 20;
            for seq in 2..=chain + 1 {
                let id = format!("p-{seq:04}");
                inbox.dispatch(&envelope(&id, &payment(&id, "o-1", seq, "ok"))).await.unwrap();
            }

            let first = inbox.dispatch(&envelope("p-0001", &payment("p-0001", "o-1", 1, "ok"))).await.unwrap();

            assert_eq!(first[0].released, inbox::RELEASES_PER_MESSAGE);
            assert_eq!(inbox.resume().await.unwrap(), 20, "the sweep releases the rest");
            assert_eq!(applied(&pool, "strict").await.len() as i64, chain + 1);
        }

        #[tokio::test]
        async fn a_source_that_fails_does_not_end_the_run() {
            let Some(pool) = database("source_errors").await else { return };
            /// A transport that fails twice, then hands over one delivery from a real broker.
            struct Flaky {
                failures: u32,
                broker: inbox::MemorySource,
            }
            impl inbox::Source for Flaky {
                async fn next(&mut self) -> Result<Option<inbox::Delivery>, inbox::SourceError> {
                    if self.failures > 0 {
                        self.failures -= 1;
                        return Err("connection reset".into());
                    }
                    self.broker.next().await
                }
            }
            let inbox = builder(&pool).handler(pay).build().await.unwrap();
            let broker = MemoryBroker::new();
            broker.publish(envelope("p-1", &payment("p-1", "o-1", 1, "ok")));
            broker.close();

            let report = inbox.run(Flaky { failures: 2, broker: broker.source() }).await.unwrap();

            assert_eq!((report.source_errors, report.acked), (2, 1), "{report:?}");
            assert_eq!(applied(&pool, "payments").await, ["p-1"]);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn every_handler_of_a_type_is_serialized_by_its_own_aggregate() {
            let Some(pool) = database("two_aggregates").await else { return };
            #[derive(Debug, Clone, Serialize, Deserialize, Message)]
            #[message(name = "hardening.line")]
            struct Line { id: String, order: String, order_seq: i64, customer: String, customer_seq: i64 }
            #[inbox_handler(key = "id", sequence = "order_seq", aggregate = "order", name = "by_order")]
            async fn by_order(ctx: &mut Context<'_, $db>, line: Line) -> Result<(), HandlerError> {
                tokio::time::sleep(Duration::from_millis(1)).await;
                sqlx::query($crate::common::sql::<$db>("INSERT INTO applied (handler, id, seq) VALUES ('by_order', $1, $2)")).bind(line.id).bind(line.order_seq).execute(&mut **ctx).await?;
                Ok(())
            }
            #[inbox_handler(key = "id", sequence = "customer_seq", aggregate = "customer", name = "by_customer")]
            async fn by_customer(ctx: &mut Context<'_, $db>, line: Line) -> Result<(), HandlerError> {
                sqlx::query($crate::common::sql::<$db>("INSERT INTO applied (handler, id, seq) VALUES ('by_customer', $1, $2)")).bind(line.id).bind(line.customer_seq).execute(&mut **ctx).await?;
                Ok(())
            }
            let inbox = builder(&pool).workers(4).handler(by_order).handler(by_customer).build().await.unwrap();
            let broker = MemoryBroker::new();
            let mut customer_seq = 0;
            for n in 0..200 {
                customer_seq += 1;
                let line = Line { id: format!("l-{n}"), order: format!("o-{n}"), order_seq: 1, customer: "c-1".into(), customer_seq };
                broker.publish(envelope(&line.id.clone(), &line));
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(report.handler_calls_with(Outcome::Stale), 0, "an in-order stream is never stale: {report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 400, "{report:?}");
        }
    };
}

mod sqlite {
    hardening_suite!(sqlx::Sqlite, crate::common::sqlite, None);
}

mod sqlite_batched {
    hardening_suite!(
        sqlx::Sqlite,
        crate::common::sqlite,
        Some(inbox::Batch::new(8))
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    hardening_suite!(sqlx::MySql, crate::common::mysql, None);

    /// MySQL rolls a whole transaction back when it chooses it to end a deadlock (or a lock
    /// wait timeout, with `innodb_rollback_on_timeout`), and the statements after it commit on
    /// their own. A handler that ignores that error and returns `Ok` has lost its writes: the
    /// guard finds the transaction gone and records a failure, to be tried again, instead of
    /// settling the message processed with nothing of it kept. The handler here ends its
    /// transaction with `ROLLBACK`, which leaves the connection as such a deadlock does.
    #[tokio::test]
    async fn a_handler_whose_transaction_the_server_rolled_back_has_failed() {
        let Some(pool) = database("rolled_back_transaction").await else {
            return;
        };
        #[inbox_handler(key = "id", name = "loses_its_transaction")]
        async fn loses_its_transaction(
            tx: &mut sqlx::MySqlConnection,
            payment: Payment,
        ) -> Result<(), HandlerError> {
            sqlx::query(
                "INSERT INTO applied (handler, id, seq) VALUES ('loses_its_transaction', ?, 1)",
            )
            .bind(payment.id)
            .execute(&mut *tx)
            .await?;
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await;
            Ok(())
        }

        let error = loses_its_transaction
            .process(&pool, payment("p-1", "o-1", 1, "ok"))
            .await
            .unwrap_err();

        crate::assert_first_attempt_failed(&error, "rolled");
        assert_eq!(
            row(&pool, "loses_its_transaction", "p-1").await.unwrap().0,
            "failed",
            "recorded, to be retried"
        );
        assert!(applied(&pool, "loses_its_transaction").await.is_empty());
    }
}

#[cfg(feature = "mysql")]
mod mysql_batched {
    hardening_suite!(
        sqlx::MySql,
        crate::common::mysql,
        Some(inbox::Batch::new(8))
    );

    /// In a batch, a handler that goes on after the server rolled the transaction back (a
    /// deadlock, here its `ROLLBACK`) is found out as soon as it returns: the handlers after it
    /// never run without a transaction, where each of their statements would commit on its own
    /// and run again when the batch is done over.
    #[tokio::test]
    async fn a_batch_finds_a_rolled_back_transaction_before_the_next_handler() {
        let Some(pool) = database("rolled_back_batch").await else {
            return;
        };
        #[inbox_handler(key = "id", name = "rolls_back_p2")]
        async fn rolls_back_p2(
            tx: &mut sqlx::MySqlConnection,
            payment: Payment,
        ) -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO applied (handler, id, seq) VALUES ('rolls_back_p2', ?, 1)")
                .bind(&payment.id)
                .execute(&mut *tx)
                .await?;
            if payment.id == "p-2" {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await;
            }
            Ok(())
        }
        let broker = MemoryBroker::new();
        for id in ["p-1", "p-2", "p-3", "p-4"] {
            broker.publish(envelope(id, &payment(id, "o-1", 1, "ok")));
        }
        broker.close();
        let batch = inbox::Batch::new(4).linger(Duration::from_millis(300));
        let inbox = builder(&pool).batch(batch).workers(1);
        let inbox = inbox.retry(RetryPolicy::new(1)).handler(rolls_back_p2);
        let inbox = inbox.build().await.unwrap();

        let report = inbox.run(broker.source()).await.unwrap();

        let applied = applied(&pool, "rolls_back_p2").await;
        assert_eq!(applied, ["p-1", "p-3", "p-4"], "{report:?}");
        let p2 = row(&pool, "rolls_back_p2", "p-2").await.unwrap().0;
        assert_eq!(p2, "dead", "{report:?}");
    }
}

mod postgres_batched {
    hardening_suite!(
        sqlx::Postgres,
        crate::common::postgres,
        Some(inbox::Batch::new(8))
    );

    /// Runs `handler` over the payments `kinds` names (`(id, kind)`, all of order `o-1`), in
    /// batches of two on one worker, one attempt each, once the id `taken` is taken in `once`.
    async fn run_in_pairs<H, Kind>(
        pool: &Pool,
        kinds: &[(&str, &str)],
        handler: H,
    ) -> inbox::RunReport
    where
        H: inbox::IntoHandler<sqlx::Postgres, (), Kind>,
    {
        sqlx::query("INSERT INTO once (id) VALUES ('taken')")
            .execute(pool)
            .await
            .unwrap();
        let broker = MemoryBroker::new();
        for (id, kind) in kinds {
            broker.publish(envelope(id, &payment(id, "o-1", 1, kind)));
        }
        broker.close();
        let pairs = inbox::Batch::new(2).linger(Duration::from_millis(300));
        let inbox = builder(pool).batch(pairs).workers(1);
        let inbox = inbox.retry(RetryPolicy::new(1)).handler(handler);
        let inbox = inbox.build().await.unwrap();
        inbox.run(broker.source()).await.unwrap()
    }

    /// A batch checks once, before it commits, that no handler left its transaction aborted
    /// (PostgreSQL would turn the `COMMIT` into a silent rollback); until then, the statements of
    /// the handlers after such a one are refused (`25P02`), which is not their failure. Either
    /// way each message of the batch goes in a transaction of its own, where the handler that
    /// went on from its failed statement is found out and only its message fails.
    #[tokio::test]
    async fn a_handler_that_leaves_a_batch_aborted_fails_alone() {
        let Some(pool) = database("aborted_batch").await else {
            return;
        };
        // Batches of two: the first ends with the handler that swallowed its error, the second
        // goes on after it.
        let kinds = [
            ("p-1", "ok"),
            ("p-2", "swallow"),
            ("p-3", "swallow"),
            ("p-4", "ok"),
        ];

        let report = run_in_pairs(&pool, &kinds, pay).await;

        assert_eq!(
            applied(&pool, "payments").await,
            ["p-1", "p-4"],
            "{report:?}"
        );
        assert_eq!(report.batches_refused, 2, "both batches: {report:?}");
        for (id, status) in [
            ("p-1", "processed"),
            ("p-2", "dead"),
            ("p-3", "dead"),
            ("p-4", "processed"),
        ] {
            let stored = row(&pool, "payments", id).await.unwrap().0;
            assert_eq!(stored, status, "{id}: {report:?}");
        }
        let error: String =
            sqlx::query_scalar("SELECT error_text FROM inbox_messages WHERE message_id = 'p-2'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(
            error.contains("savepoint"),
            "the error says what to do: {error}"
        );
    }

    /// A handler's own error type may hide the `sqlx::Error` it wraps (`#[error(transparent)]`
    /// forwards `source()` past it) or keep only its text: a statement refused because an earlier
    /// handler of the batch left the transaction aborted is still not its handler's failure.
    #[tokio::test]
    async fn a_handler_after_one_that_left_a_batch_aborted_is_not_charged_whatever_its_error() {
        #[derive(Debug, thiserror::Error)]
        enum ShopError {
            #[error(transparent)]
            Database(#[from] sqlx::Error),
            #[error("could not record the payment: {0}")]
            Text(String),
        }
        #[inbox_handler(key = "id", name = "shop")]
        async fn shop(tx: &mut sqlx::PgConnection, payment: Payment) -> Result<(), ShopError> {
            let taken = sqlx::query("INSERT INTO once (id) VALUES ('taken')");
            match payment.kind.as_str() {
                "swallow" => {
                    let _ = taken.execute(&mut *tx).await;
                    return Ok(());
                }
                "taken" => {
                    let taken = taken.execute(&mut *tx).await;
                    taken.map_err(|error| ShopError::Text(error.to_string()))?;
                }
                _ => {}
            }
            let insert =
                sqlx::query("INSERT INTO applied (handler, id, seq) VALUES ('shop', $1, 1)")
                    .bind(&payment.id)
                    .execute(&mut *tx)
                    .await;
            match payment.kind.as_str() {
                "text" => insert.map_err(|error| ShopError::Text(error.to_string()))?,
                _ => insert?,
            };
            Ok(())
        }
        let Some(pool) = database("aborted_batch_wrapped").await else {
            return;
        };
        // Batches of two: twice a handler that swallowed its error and one that goes on after
        // it, then a handler that failed first in its batch, which is its own failure.
        let kinds = [
            ("p-1", "swallow"),
            ("p-2", "wrapped"),
            ("p-3", "swallow"),
            ("p-4", "text"),
            ("p-5", "taken"),
            ("p-6", "wrapped"),
        ];

        let report = run_in_pairs(&pool, &kinds, shop).await;

        let applied = applied(&pool, "shop").await;
        assert_eq!(applied, ["p-2", "p-4", "p-6"], "{report:?}");
        assert_eq!(report.batches_refused, 2, "the first two: {report:?}");
        for (id, status) in [
            ("p-1", "dead"),
            ("p-2", "processed"),
            ("p-3", "dead"),
            ("p-4", "processed"),
            ("p-5", "dead"),
            ("p-6", "processed"),
        ] {
            let stored = row(&pool, "shop", id).await.unwrap().0;
            assert_eq!(stored, status, "{id}: {report:?}");
        }
    }
}

mod postgres {
    hardening_suite!(sqlx::Postgres, crate::common::postgres, None);

    /// PostgreSQL aborts a transaction at its first failed statement and turns `COMMIT` into a
    /// silent rollback: a handler that ignores the error and returns `Ok` has committed nothing.
    #[tokio::test]
    async fn a_handler_that_leaves_its_transaction_aborted_has_failed() {
        let Some(pool) = database("aborted_transaction").await else {
            return;
        };
        #[inbox_handler(key = "id", name = "ignores_errors")]
        async fn ignores_errors(
            tx: &mut sqlx::PgConnection,
            payment: Payment,
        ) -> Result<(), HandlerError> {
            let _ = sqlx::query("INSERT INTO once (id) VALUES ('taken')")
                .execute(&mut *tx)
                .await;
            sqlx::query("INSERT INTO applied (handler, id, seq) VALUES ('ignores_errors', $1, 1)")
                .bind(payment.id)
                .execute(&mut *tx)
                .await
                .ok();
            Ok(())
        }
        sqlx::query("INSERT INTO once (id) VALUES ('taken')")
            .execute(&pool)
            .await
            .unwrap();

        let error = ignores_errors
            .process(&pool, payment("p-1", "o-1", 1, "ok"))
            .await
            .unwrap_err();

        crate::assert_first_attempt_failed(&error, "savepoint");
        assert_eq!(
            row(&pool, "ignores_errors", "p-1").await.unwrap().0,
            "failed",
            "recorded, to be retried"
        );
        assert!(applied(&pool, "ignores_errors").await.is_empty());
    }

    /// A connection the server ended under a handler is no failure of the handler's, even when
    /// the handler's own error type hides the `sqlx::Error` (`#[error(transparent)]` forwards
    /// `source()` past it, to the database's error).
    #[tokio::test]
    async fn a_connection_ended_under_a_handler_counts_no_attempt_whatever_its_error() {
        #[derive(Debug, thiserror::Error)]
        enum ShopError {
            #[error(transparent)]
            Database(#[from] sqlx::Error),
        }
        #[inbox_handler(key = "id", name = "cut_off")]
        async fn cut_off(tx: &mut sqlx::PgConnection, payment: Payment) -> Result<(), ShopError> {
            if payment.kind == "cut" {
                let end_own = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())");
                end_own.execute(&mut *tx).await?;
            }
            Ok(())
        }
        let Some(pool) = database("ended_under_wrapped").await else {
            return;
        };
        let inbox = builder(&pool).handler(cut_off).build().await.unwrap();

        let cut = envelope("p-1", &payment("p-1", "o-1", 1, "cut"));
        let error = inbox.dispatch(&cut).await.unwrap_err();

        assert!(matches!(error, Error::ConnectionLost { .. }), "{error}");
        assert_eq!(
            row(&pool, "cut_off", "p-1").await,
            None,
            "no attempt counted"
        );
    }
}
