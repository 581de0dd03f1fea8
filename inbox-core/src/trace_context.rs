//! W3C trace context (feature `opentelemetry`): a delivery's `traceparent` and `tracestate`
//! headers become the parent of its `inbox.process` span, and a message written to the outbox
//! carries the context current when it was written, so a trace follows a message through the
//! inbox and out again. Spans reach OpenTelemetry through `tracing-opentelemetry`'s layer;
//! without that layer, or without the feature, these do nothing.

use tracing::Span;

use crate::keys::Headers;

/// The W3C header of the parent span.
pub const TRACEPARENT: &str = "traceparent";

/// The W3C header of vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

/// Makes the context in `headers`, if any, the parent of `span`.
#[cfg(feature = "opentelemetry")]
pub(crate) fn adopt_parent(span: &Span, headers: Option<&Headers>) {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let Some(headers) = headers.filter(|headers| headers.contains_key(TRACEPARENT)) else {
        return;
    };
    let parent = TraceContextPropagator::new().extract(&HeaderMap(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Without the feature: nothing.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn adopt_parent(_: &Span, _: Option<&Headers>) {}

/// Adds the current span's context to `headers`, unless they carry one already.
#[cfg(feature = "opentelemetry")]
pub(crate) fn inject_current(headers: &mut Headers) {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let context = Span::current().context();
    if headers.contains_key(TRACEPARENT) || !context.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&context, &mut HeaderMapMut(headers));
}

/// Without the feature: nothing.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn inject_current(_: &mut Headers) {}

/// Headers as the propagator reads them.
#[cfg(feature = "opentelemetry")]
struct HeaderMap<'a>(&'a Headers);

#[cfg(feature = "opentelemetry")]
impl opentelemetry::propagation::Extractor for HeaderMap<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Headers as the propagator writes them.
#[cfg(feature = "opentelemetry")]
struct HeaderMapMut<'a>(&'a mut Headers);

#[cfg(feature = "opentelemetry")]
impl opentelemetry::propagation::Injector for HeaderMapMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}
