//! The span of a handled message carries the OpenTelemetry messaging attributes and the inbox's
//! own, including the attempt and the outcome once they are known; an unsafe retention window is
//! a warning at startup. The span tests run on every backend, one message per transaction and
//! batched.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox::Retention;
use inbox::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.paid")]
struct Paid {
    event_id: String,
    order: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order")]
async fn paid(_msg: Paid) -> Result<(), HandlerError> {
    Ok(())
}

/// The fields of every `inbox.process` span, as text, by span.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: LayerContext<'_, S>) {
        if attrs.metadata().name() == "inbox.process" {
            let mut fields = BTreeMap::from([("span.id".to_owned(), id.into_u64().to_string())]);
            attrs.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: LayerContext<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        let span_id = id.into_u64().to_string();
        if let Some(fields) = spans
            .iter_mut()
            .rev()
            .find(|fields| fields["span.id"] == span_id)
        {
            values.record(&mut Fields(fields));
        }
    }
}

/// The messages of every warning.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        if *event.metadata().level() == Level::WARN {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().extend(fields.remove("message"));
        }
    }
}

#[tokio::test]
async fn a_retention_window_shorter_than_the_redelivery_horizon_warns_at_startup() {
    let pool = common::sqlite("retention_warning").await.unwrap();
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let day = Duration::from_secs(86_400);
    for window in [3 * day, day] {
        let retention = Retention::new(window).redelivery_horizon(3 * day);
        let builder = Inbox::builder(pool.clone()).retention(retention);
        builder.handler(paid).build().await.unwrap();
    }

    let warnings = warnings.0.lock().unwrap().clone();
    assert_eq!(
        warnings.len(),
        1,
        "only the one-day window warns: {warnings:?}"
    );
    assert!(warnings[0].contains("shorter than the broker's redelivery horizon"));
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order",
    ordering = "strict",
    name = "strictly_paid"
)]
async fn strictly_paid(_msg: Paid) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(key = "event_id", aggregate = "order", name = "picky")]
async fn picky(msg: Paid) -> Result<(), HandlerError> {
    match msg.event_id.starts_with("bad") {
        true => Err(HandlerError::permanent(HandlerError::msg("bad is refused"))),
        false => Ok(()),
    }
}

/// The suite, once per backend and mode (`common::on_every_backend!`). The spans are recorded by a
/// subscriber of the test's own thread, which runs the whole inbox (`#[tokio::test]`'s runtime).
macro_rules! spans_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;
        use std::time::Duration;

        use inbox::prelude::*;
        use tracing_subscriber::layer::SubscriberExt;

        use super::{Paid, Spans, paid, picky, strictly_paid};

        /// A run of `inbox` over `envelopes`, in this order, and the spans it left.
        async fn spans_of_run(
            inbox: Inbox<$db>,
            envelopes: impl IntoIterator<Item = Envelope>,
        ) -> Vec<BTreeMap<String, String>> {
            let spans = Spans::default();
            let _guard = tracing::subscriber::set_default(
                tracing_subscriber::registry().with(spans.clone()),
            );
            let broker = inbox::MemoryBroker::new();
            for envelope in envelopes {
                broker.publish(envelope);
            }
            broker.close();
            inbox.run(broker.source()).await.unwrap();
            spans.0.lock().unwrap().clone()
        }

        /// The suite's mode, a batch waiting long enough to take every delivery of a short run.
        fn batch() -> Option<inbox::Batch> {
            $batch.map(|batch: inbox::Batch| batch.linger(Duration::from_millis(300)))
        }

        fn paid_at(event_id: &str, sequence: i64) -> Envelope {
            let event = Paid {
                event_id: event_id.into(),
                order: "o-7".into(),
                sequence,
            };
            Envelope::encode(format!("d-{event_id}"), &event).unwrap()
        }

        #[tokio::test]
        async fn each_message_has_a_span_with_the_messaging_conventions() {
            let Some(pool) = $connect("tracing_span").await else {
                return;
            };
            let inbox = crate::common::builder(&pool, batch())
                .consumer("billing")
                .handler(paid)
                .build()
                .await
                .unwrap();
            let envelope = paid_at("e-1", 3)
                .with_header("correlation-id", "c-42")
                .with_header("destination", "orders");

            let spans = spans_of_run(inbox, [envelope.clone(), envelope]).await;

            assert_eq!(spans.len(), 2, "{spans:?}");
            let expected = [
                ("messaging.operation.type", "process"),
                ("messaging.message.id", "e-1"),
                ("messaging.consumer.group.name", "billing"),
                ("messaging.destination.name", "orders"),
                ("messaging.message.conversation_id", "c-42"),
                ("inbox.handler", "paid"),
                ("inbox.message_type", "test.paid"),
                ("inbox.aggregate", "o-7"),
                ("inbox.sequence", "3"),
                ("inbox.attempt", "1"),
                ("inbox.outcome", "processed"),
            ];
            for (field, value) in expected {
                let recorded = spans[0].get(field).map(String::as_str);
                assert_eq!(recorded, Some(value), "{field} in {:?}", spans[0]);
            }
            assert_eq!(spans[1]["inbox.outcome"], "duplicate");
        }

        /// A message released from parking, after its predecessor applied, has a span of its
        /// own: it runs after the predecessor's span has ended.
        #[tokio::test]
        async fn a_released_message_has_a_span_of_its_own() {
            let Some(pool) = $connect("tracing_released").await else {
                return;
            };
            let inbox = crate::common::builder(&pool, batch())
                .handler(strictly_paid)
                .build()
                .await
                .unwrap();

            let spans = spans_of_run(inbox, [paid_at("e-2", 2), paid_at("e-1", 1)]).await;

            let outcome = |id: &str| {
                let of_id = |span: &&BTreeMap<String, String>| span["messaging.message.id"] == id;
                let outcomes = spans
                    .iter()
                    .filter(of_id)
                    .map(|span| span["inbox.outcome"].as_str());
                outcomes.collect::<Vec<_>>()
            };
            assert_eq!(outcome("e-2"), ["parked", "released"], "{spans:?}");
            let released = spans
                .iter()
                .find(|span| span["inbox.outcome"] == "released");
            let attempt = released.and_then(|span| span.get("inbox.attempt"));
            assert_eq!(
                attempt.map(String::as_str),
                Some("1"),
                "the handler ran in it"
            );
            assert_eq!(outcome("e-1"), ["processed"], "{spans:?}");
        }

        /// Each message has one span with its outcome. In batched mode, a batch abandoned for
        /// one message's failure runs the messages before it again, in a batch of their own, and
        /// they keep their one span each.
        #[tokio::test]
        async fn a_message_run_again_after_its_batch_was_abandoned_keeps_its_one_span() {
            let Some(pool) = $connect("tracing_abandoned_batch").await else {
                return;
            };
            let inbox = crate::common::builder(&pool, batch())
                .workers(1)
                .handler(picky)
                .build()
                .await
                .unwrap();
            let envelopes = ["a", "b", "bad", "c"].map(|id| {
                let event = Paid {
                    event_id: id.into(),
                    order: format!("o-{id}"),
                    sequence: 1,
                };
                Envelope::encode(format!("d-{id}"), &event).unwrap()
            });

            let spans = spans_of_run(inbox, envelopes).await;

            assert_eq!(spans.len(), 4, "one span per message: {spans:#?}");
            let outcomes: BTreeMap<&str, &str> = spans
                .iter()
                .map(|span| (&*span["messaging.message.id"], &*span["inbox.outcome"]))
                .collect();
            let expected = [
                ("a", "processed"),
                ("b", "processed"),
                ("bad", "dead"),
                ("c", "processed"),
            ];
            assert_eq!(outcomes, BTreeMap::from(expected));
        }
    };
}

common::on_every_backend!(spans_suite, batched);

/// The SQL of every statement sqlx ran, in order.
#[derive(Clone, Default)]
struct Statements(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        if let Some(sql) = fields.remove("db.statement") {
            self.0.lock().unwrap().push(sql);
        }
    }
}

/// On PostgreSQL one statement claims a message's dedup row and advances its stream, for a new
/// message and for a stale one alike.
#[tokio::test]
async fn postgres_claims_a_message_and_advances_its_stream_in_one_statement() {
    let Some(pool) = common::postgres("claim_and_advance").await else {
        return;
    };
    let statements = Statements::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(statements.clone()));
    let paid_at = |event_id: &str, sequence| Paid {
        event_id: event_id.into(),
        order: "o-1".into(),
        sequence,
    };

    let newer = paid.process(&pool, paid_at("e-2", 2)).await.unwrap();
    let older = paid.process(&pool, paid_at("e-1", 1)).await.unwrap();

    assert_eq!((newer, older), (Outcome::Processed, Outcome::Stale));
    let statements = statements.0.lock().unwrap().clone();
    let streams: Vec<&String> = statements
        .iter()
        .filter(|sql| sql.contains("inbox_streams"))
        .collect();
    assert_eq!(streams.len(), 2, "{statements:#?}");
    let claims_too = |sql: &&String| sql.contains("INSERT INTO inbox_messages");
    assert!(streams.iter().all(claims_too), "{statements:#?}");
}

/// On PostgreSQL a batch settles its stale messages in one statement, and places a stream's
/// messages after a stale first one in bulk too: a replayed run of late messages costs the
/// batch a fixed number of statements, however many messages it holds.
#[tokio::test]
async fn postgres_batch_settles_its_stale_messages_in_one_statement() {
    let Some(pool) = common::postgres("stale_in_bulk").await else {
        return;
    };
    let paid_at = |sequence: i64| Paid {
        event_id: format!("e-{sequence}"),
        order: "o-1".into(),
        sequence,
    };
    paid.process(&pool, paid_at(100)).await.unwrap();
    let inbox = Inbox::builder(pool.clone())
        .workers(1)
        .batch(inbox::Batch::new(32).linger(Duration::from_millis(300)))
        .handler(paid)
        .build()
        .await
        .unwrap();
    let broker = inbox::MemoryBroker::new();
    let sequences = (1..=10).chain([101, 102]);
    for sequence in sequences {
        broker.publish(Envelope::encode(format!("d-{sequence}"), &paid_at(sequence)).unwrap());
    }
    broker.close();
    let statements = Statements::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(statements.clone()));

    let report = inbox.run(broker.source()).await.unwrap();

    let outcomes = [Outcome::Stale, Outcome::Processed].map(|o| report.handler_calls_with(o));
    assert_eq!(outcomes, [10, 2], "{report:?}");
    let statements = statements.0.lock().unwrap().clone();
    let touching = |table: &str| statements.iter().filter(|sql| sql.contains(table)).count();
    // Advance every stream, read where the unmoved ones stand, move them on past the late ones.
    assert_eq!(touching("inbox_streams"), 3, "{statements:#?}");
    assert_eq!(touching("UPDATE inbox_messages"), 1, "{statements:#?}");
    let last = "SELECT last_sequence FROM inbox_streams";
    let last: i64 = sqlx::query_scalar(last).fetch_one(&pool).await.unwrap();
    assert_eq!(last, 102);
}
