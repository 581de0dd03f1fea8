//! W3C trace context (feature `opentelemetry`): a delivery's `traceparent` makes its
//! `inbox.process` span a child of the producer's span, in the producer's trace; what the handler
//! publishes to the outbox carries the context of that span; a delivery without one starts a
//! trace of its own.

use inbox::prelude::*;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.order_paid")]
struct OrderPaid {
    event_id: u64,
}

/// Publishes a receipt for each payment, through the outbox, in the guarded transaction.
#[inbox_handler(key = "event_id")]
async fn send_receipt(
    ctx: &mut Context<'_, sqlx::Sqlite>,
    msg: OrderPaid,
) -> Result<(), HandlerError> {
    ctx.publish(&OrderPaid {
        event_id: msg.event_id + 1000,
    })
    .await?;
    Ok(())
}

/// Every span of this test binary goes to one in-memory exporter, through one global
/// subscriber (a scoped one would not see spans that other threads' callsites cached).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("inbox-test")));
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        exporter
    })
}

/// The `inbox.process` span of the delivery of event `event_id`, and the outbox's headers after
/// it was handled.
async fn traced(event_id: u64, envelope: Envelope) -> (SpanData, Vec<inbox::Headers>) {
    let exporter = exporter();
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    inbox::migrate(&pool).await.unwrap();
    let inbox = Inbox::builder(pool.clone())
        .handler(send_receipt)
        .build()
        .await
        .unwrap();
    inbox.dispatch(&envelope).await.unwrap();

    let outbox = inbox::outbox::list(&pool, None, 10).await.unwrap();
    let headers = outbox.into_iter().map(|message| message.headers).collect();
    for _ in 0..200 {
        let spans = exporter.get_finished_spans().unwrap();
        if let Some(span) = spans.into_iter().find(|span| is_process_of(span, event_id)) {
            return (span, headers);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no inbox.process span was exported for event {event_id}");
}

fn is_process_of(span: &SpanData, event_id: u64) -> bool {
    span.name == "inbox.process"
        && span.attributes.iter().any(|attribute| {
            attribute.key.as_str() == "messaging.message.id"
                && attribute.value.as_str() == event_id.to_string()
        })
}

fn paid(event_id: u64) -> Envelope {
    Envelope::encode(format!("paid-{event_id}"), &OrderPaid { event_id }).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_with_a_traceparent_is_handled_in_the_producer_trace() {
    let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01");
    let envelope = paid(1).with_header("traceparent", traceparent);

    let (span, outbox) = traced(1, envelope).await;

    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
    let published = outbox[0]
        .get("traceparent")
        .expect("the outbox message carries the context");
    let expected = format!("00-{TRACE_ID}-{}-01", span.span_context.span_id());
    assert_eq!(
        published, &expected,
        "the receipt continues the trace from the handler's span"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_without_a_traceparent_starts_a_trace_of_its_own() {
    let (span, outbox) = traced(2, paid(2)).await;

    assert_ne!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(span.parent_span_id, SpanId::INVALID);
    let published = outbox[0]
        .get("traceparent")
        .expect("the outbox message carries the context");
    assert!(
        published.contains(&span.span_context.trace_id().to_string()),
        "{published}"
    );
}
