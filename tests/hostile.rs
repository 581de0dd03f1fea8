//! Hostile input through the runtime: NUL characters in keys, aggregates, delivery ids, type tags,
//! plain fields and handler errors; invalid UTF-8; JSON nested 10 000 deep, in a typed field and
//! in an unknown one; a 100 MB payload; sequences at the edges of `i64` and outside what each
//! ordering accepts; empty and oversized ids; wrong field types; unknown type tags. All of them go
//! to one broker with a few good events, and the run must end with every delivery acknowledged and
//! recorded: processed, kept as rejected with its bytes and a reason, or dead after exactly
//! `max_attempts` handler runs; handed back only for the failing handler's retries. Every test runs
//! on SQLite and, when configured, on PostgreSQL.

mod common;

macro_rules! hostile_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{DEFAULT_MAX_PAYLOAD_BYTES, MAX_SEQUENCE, MemoryBroker, RejectedDelivery};

        type Pool = sqlx::Pool<$db>;

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        /// One type for every case; `kind` says how the handlers behave.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "hostile.event")]
        struct Event {
            id: String,
            agg: String,
            seq: i64,
            kind: String,
        }

        const MAX_ATTEMPTS: u32 = 3;

        /// How many times the monotonic handler ran a `nul-error` event.
        static NUL_ERROR_RUNS: AtomicU32 = AtomicU32::new(0);

        async fn see(ctx: &mut Context<'_, $db>, id: String) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO seen (id) VALUES ($1)")).bind(id).execute(&mut **ctx).await?;
            Ok(())
        }

        /// Fails every `nul-error` event with an error text that holds a NUL byte.
        #[inbox_handler(key = "id", sequence = "seq", aggregate = "agg", name = "monotonic")]
        async fn monotonic(ctx: &mut Context<'_, $db>, event: Event) -> Result<(), HandlerError> {
            if event.kind == "nul-error" {
                NUL_ERROR_RUNS.fetch_add(1, Ordering::SeqCst);
                return Err(HandlerError::msg("bad \0 input"));
            }
            see(ctx, event.id).await
        }

        #[inbox_handler(key = "id", sequence = "seq", aggregate = "agg", ordering = "strict", name = "strict")]
        async fn strict(ctx: &mut Context<'_, $db>, event: Event) -> Result<(), HandlerError> {
            see(ctx, event.id).await
        }

        /// A type whose own deserialization panics on a count that is not positive.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "hostile.touchy")]
        struct Touchy {
            id: String,
            #[serde(deserialize_with = "positive")]
            count: i64,
        }

        fn positive<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
            let count = <i64 as serde::Deserialize>::deserialize(deserializer)?;
            assert!(count > 0, "the count must be positive");
            Ok(count)
        }

        #[inbox_handler(key = "id")]
        async fn touchy(ctx: &mut Context<'_, $db>, event: Touchy) -> Result<(), HandlerError> {
            see(ctx, event.id).await
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            sqlx::query($crate::common::sql::<$db>("CREATE TABLE seen (id TEXT NOT NULL)")).execute(&pool).await.unwrap();
            Some(pool)
        }

        async fn seen(pool: &Pool) -> Vec<String> {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT id FROM seen ORDER BY id")).fetch_all(pool).await.unwrap()
        }

        /// A delivery the inbox must keep as rejected, with (part of) the reason it must give.
        struct Rejection {
            envelope: Envelope,
            reason: String,
        }

        fn rejection(delivery_id: &str, payload: Vec<u8>, reason: impl Into<String>) -> Rejection {
            Rejection { envelope: Envelope::new("hostile.event", delivery_id, payload), reason: reason.into() }
        }

        /// An event's JSON with `seq` as given, in its own aggregate.
        fn with_seq(id: &str, seq: &str) -> Vec<u8> {
            format!(r#"{{"id":"{id}","agg":"{id}","seq":{seq},"kind":"ok"}}"#).into_bytes()
        }

        /// An event whose `kind` is `len` spaces: a payload of about `len` bytes.
        fn huge(len: usize) -> Vec<u8> {
            let mut payload = br#"{"id":"huge","agg":"huge","seq":1,"kind":""#.to_vec();
            payload.resize(payload.len() + len, b' ');
            payload.extend_from_slice(br#""}"#);
            payload
        }

        /// Arrays nested `depth` deep.
        fn nested(depth: usize) -> String {
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        }

        fn sequence_refused(sequence: i64, first: i64) -> String {
            format!("invalid sequence: it is {sequence}; sequences run from {first} to {MAX_SEQUENCE}")
        }

        /// The bad deliveries. The monotonic handler is registered first, so it refuses the
        /// sequences outside `0..=MAX_SEQUENCE`; the strict one refuses 0.
        fn rejections() -> Vec<Rejection> {
            let long_id = "x".repeat(600);
            let big = huge(100 * 1024 * 1024);
            let too_large = format!(
                "the payload is {} bytes; the limit is {DEFAULT_MAX_PAYLOAD_BYTES} (its first {DEFAULT_MAX_PAYLOAD_BYTES} bytes are kept)",
                big.len()
            );
            vec![
                rejection("d-nul-key", br#"{"id":"a\u0000b","agg":"nul-key","seq":1,"kind":"ok"}"#.to_vec(), "invalid message id: it contains a NUL character"),
                rejection("d-nul-agg", br#"{"id":"nul-agg","agg":"a\u0000b","seq":1,"kind":"ok"}"#.to_vec(), "invalid aggregate id: it contains a NUL character"),
                rejection("d-not-utf8", vec![0xff, 0xfe, b'{'], "cannot decode a `hostile.event` payload: expected value at line 1 column 1"),
                rejection("d-not-utf8-in-string", b"{\"id\":\"\xff\xfe\",\"agg\":\"a\",\"seq\":1,\"kind\":\"ok\"}".to_vec(), "cannot decode a `hostile.event` payload: invalid unicode code point"),
                rejection("d-deep-kind", format!(r#"{{"id":"deep-kind","agg":"a","seq":1,"kind":{}}}"#, nested(10_000)).into_bytes(), "invalid type: sequence, expected a string"),
                rejection("d-huge", big, too_large),
                rejection("d-seq-min", with_seq("seq-min", &i64::MIN.to_string()), sequence_refused(i64::MIN, 0)),
                rejection("d-seq-max", with_seq("seq-max", &i64::MAX.to_string()), sequence_refused(i64::MAX, 0)),
                rejection("d-seq-past-max", with_seq("seq-past-max", &(MAX_SEQUENCE + 1).to_string()), sequence_refused(MAX_SEQUENCE + 1, 0)),
                rejection("d-seq-zero", with_seq("seq-zero", "0"), sequence_refused(0, 1)),
                rejection("d-seq-past-i64", with_seq("seq-past-i64", "9223372036854775808"), "invalid value: integer `9223372036854775808`, expected i64"),
                rejection("d-seq-text", with_seq("seq-text", r#""seven""#), r#"invalid type: string "seven", expected i64"#),
                rejection("d-empty-id", with_seq("", "1"), "invalid message id: it is empty"),
                rejection("d-long-id", with_seq(&long_id, "1"), "invalid message id: it is 600 bytes long; the limit is 512"),
                Rejection {
                    envelope: Envelope::new("hostile.unknown", "d-\0-unknown", with_seq("unknown", "1")),
                    reason: "no handler is registered for message type `hostile.unknown`".into(),
                },
                Rejection {
                    envelope: Envelope::new("hostile.\0tag", "d-nul-tag", with_seq("nul-tag", "1")),
                    reason: r"no handler is registered for message type `hostile.\0tag`".into(),
                },
            ]
        }

        /// The deliveries both handlers take: a good one; one with a NUL in its delivery id and
        /// in a plain field; one with an unknown field nested 10 000 arrays deep, which serde skips
        /// without recursing; and one the monotonic handler fails with a NUL in its error.
        fn accepted() -> Vec<Envelope> {
            let event = |id: &str, kind: &str| Event { id: id.into(), agg: id.into(), seq: 1, kind: kind.into() };
            let deep_extra = format!(r#"{{"id":"deep-extra","agg":"deep-extra","seq":1,"kind":"ok","extra":{}}}"#, nested(10_000));
            vec![
                Envelope::encode("d-good", &event("good", "ok")).unwrap(),
                Envelope::encode("d-\0-nul-field", &event("nul-field", "a\0b")).unwrap(),
                Envelope::new("hostile.event", "d-deep-extra", deep_extra.into_bytes()),
                Envelope::encode("d-nul-error", &event("nul-error", "nul-error")).unwrap(),
            ]
        }

        /// `text` as the inbox stores it: a NUL escaped as `\0`.
        fn stored(text: &str) -> String {
            text.replace('\0', r"\0")
        }

        /// `expected` is kept with the reason, its delivery id and type tag as stored, and the
        /// first `DEFAULT_MAX_PAYLOAD_BYTES` of its payload (all of it, for all but the huge one).
        fn assert_kept(rejected: &[RejectedDelivery], expected: &Rejection) {
            let envelope = &expected.envelope;
            let delivery_id = stored(envelope.id());
            let kept = rejected.iter().find(|r| r.delivery_id == delivery_id);
            let kept = kept.unwrap_or_else(|| panic!("{delivery_id} is not kept as rejected"));
            assert_eq!(kept.message_type, stored(envelope.message_type()), "{delivery_id}");
            assert!(kept.reason.contains(&expected.reason), "{delivery_id}: {:?} is not about {:?}", kept.reason, expected.reason);
            let payload = &envelope.payload()[..envelope.payload().len().min(DEFAULT_MAX_PAYLOAD_BYTES)];
            assert!(kept.payload == payload, "{delivery_id}: {} bytes kept, not the {} delivered", kept.payload.len(), payload.len());
        }

        async fn assert_status(inbox: &Inbox<$db>, handler: &str, message_id: &str, status: &str) {
            let shown = inbox.show(handler, message_id).await.unwrap();
            assert_eq!(shown.map(|m| m.status.as_str()), Some(status), "{handler} {message_id}");
        }

        #[tokio::test]
        async fn every_hostile_delivery_ends_acknowledged_and_recorded() {
            let Some(pool) = database("hostile").await else { return };
            let retry = RetryPolicy::new(MAX_ATTEMPTS).backoff(Duration::from_millis(5), Duration::from_millis(20));
            let inbox = builder(&pool).retry(retry).handler(monotonic).handler(strict).build().await.unwrap();
            let rejections = rejections();
            let accepted = accepted();
            let broker = MemoryBroker::new();
            for envelope in rejections.iter().map(|r| &r.envelope).chain(&accepted) {
                broker.publish(envelope.clone());
            }
            broker.close();
            let deliveries = (rejections.len() + accepted.len()) as u64;

            let run = tokio::time::timeout(Duration::from_secs(60), inbox.run(broker.source()));
            let report = run.await.expect("the run ends").expect("the source does not fail");

            assert_eq!(broker.acked(), deliveries, "{report:?}");
            assert_eq!((broker.queued(), broker.in_flight()), (0, 0));
            assert!(broker.redelivered() <= u64::from(MAX_ATTEMPTS - 1) + 2, "handed back {} times", broker.redelivered());
            assert_eq!(report.rejected, rejections.len() as u64, "{report:?}");
            assert_eq!(report.acked + report.rejected, deliveries, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 7, "three by both, nul-error by strict: {report:?}");

            let rejected = inbox.rejected().await.unwrap();
            assert_eq!(rejected.len(), rejections.len());
            for expected in &rejections {
                assert_kept(&rejected, expected);
            }
            let cut = rejected.iter().find(|r| r.delivery_id == "d-huge").unwrap();
            assert_eq!(cut.payload.len(), DEFAULT_MAX_PAYLOAD_BYTES, "the 100 MB payload is cut to the limit");

            let dead = inbox.dead().await.unwrap();
            let dead: Vec<_> = dead.iter().map(|m| (m.handler.as_str(), m.message_id.as_str(), m.attempt_count)).collect();
            assert_eq!(dead, [("monotonic", "nul-error", MAX_ATTEMPTS as i32)]);
            assert_eq!(NUL_ERROR_RUNS.load(Ordering::SeqCst), MAX_ATTEMPTS, "the handler ran once per attempt");
            let nul_error = inbox.show("monotonic", "nul-error").await.unwrap().unwrap();
            let error = Some(r"bad \0 input");
            assert_eq!((nul_error.first_error.as_deref(), nul_error.error_text.as_deref()), (error, error), "stored escaped");

            for message_id in ["good", "nul-field", "deep-extra"] {
                assert_status(&inbox, "monotonic", message_id, "processed").await;
                assert_status(&inbox, "strict", message_id, "processed").await;
            }
            assert_status(&inbox, "strict", "nul-error", "processed").await;
            assert_eq!(seen(&pool).await, ["deep-extra", "deep-extra", "good", "good", "nul-error", "nul-field", "nul-field"]);
            assert!(inbox.parked().await.unwrap().is_empty(), "nothing waits for a predecessor");
        }

        #[tokio::test]
        async fn a_payload_whose_deserialization_panics_is_kept_as_rejected_and_the_run_goes_on() {
            let Some(pool) = database("hostile_panicking_decode").await else { return };
            let inbox = builder(&pool).handler(touchy).build().await.unwrap();
            let broker = MemoryBroker::new();
            let panicking = Envelope::new("hostile.touchy", "d-panics", br#"{"id":"zero","count":0}"#.to_vec());
            broker.publish(panicking.clone());
            broker.publish(Envelope::encode("d-fine", &Touchy { id: "one".into(), count: 1 }).unwrap());
            broker.close();

            let run = tokio::time::timeout(Duration::from_secs(30), inbox.run(broker.source()));
            let report = run.await.expect("the run ends").expect("the source does not fail");

            assert_eq!((broker.acked(), report.rejected), (2, 1), "{report:?}");
            let expected = Rejection { envelope: panicking, reason: "its deserialization panicked: the count must be positive".into() };
            assert_kept(&inbox.rejected().await.unwrap(), &expected);
            assert_eq!(seen(&pool).await, ["one"]);
        }
    };
}

common::on_every_backend!(hostile_suite, batched);
