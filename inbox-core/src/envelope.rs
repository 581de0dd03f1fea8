//! What a broker hands over: a type tag, an id, raw payload bytes and headers.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::queue::QueueReceipt;

/// One message as delivered, before decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    message_type: String,
    id: String,
    payload: Vec<u8>,
    headers: BTreeMap<String, String>,
    produced_at: Option<SystemTime>,
    receipt: Option<QueueReceipt>,
}

impl Envelope {
    /// An envelope for a payload of the given type tag. `id` is the transport's id for the
    /// delivery (used in logs); the dedup key comes from the handler's `key` fields. The payload
    /// is any bytes: a `Vec<u8>`, a slice, `b"..."`.
    pub fn new(
        message_type: impl Into<String>,
        id: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            message_type: message_type.into(),
            id: id.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            produced_at: None,
            receipt: None,
        }
    }

    /// Encodes a message as JSON under its type tag.
    ///
    /// If the message declares an aggregate ([`Message::aggregate`](crate::Message::aggregate),
    /// `#[message(aggregate = "field")]`), the envelope carries it in the
    /// [`AGGREGATE_ID`](crate::outbox::AGGREGATE_ID) header: Kafka's publisher keys the record by
    /// it and the PostgreSQL queue hands out one aggregate's messages in order. A later
    /// [`with_header`](Self::with_header) of the same name replaces it.
    ///
    /// ```
    /// # use inbox_core::{Envelope, Message};
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Ping { id: u32 }
    /// impl Message for Ping { const TYPE: &'static str = "ping"; }
    ///
    /// let envelope = Envelope::encode("d-1", &Ping { id: 7 }).unwrap();
    /// assert_eq!(envelope.message_type(), "ping");
    /// assert_eq!(envelope.payload(), br#"{"id":7}"#);
    /// assert!(envelope.headers().is_empty()); // no aggregate, no aggregate-id header
    /// ```
    pub fn encode<M: crate::Message>(
        id: impl Into<String>,
        message: &M,
    ) -> Result<Self, crate::Error> {
        let payload =
            serde_json::to_vec(message).map_err(|e| crate::Error::Encode(e.to_string()))?;
        let envelope = Self::new(M::TYPE, id, payload);
        Ok(match message.aggregate() {
            Some(aggregate) => envelope.with_header(crate::outbox::AGGREGATE_ID, aggregate),
            None => envelope,
        })
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// When the producer published the message (the broker's timestamp): a runtime then records
    /// the end-to-end lag, from publication to processed, in `inbox_lag_seconds`.
    pub fn with_produced_at(mut self, produced_at: SystemTime) -> Self {
        self.produced_at = Some(produced_at);
        self
    }

    /// When the producer published the message, if the transport said.
    pub fn produced_at(&self) -> Option<SystemTime> {
        self.produced_at
    }

    /// The type tag that selects the handlers.
    pub fn message_type(&self) -> &str {
        &self.message_type
    }

    /// The transport's id for this delivery.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The raw payload bytes, exactly as delivered.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// This envelope with only the first `max_bytes` bytes of its payload: what the inbox keeps of
    /// an oversized delivery it rejects.
    ///
    /// ```
    /// # use inbox_core::Envelope;
    /// let big = Envelope::new("blob", "d-1", vec![b'x'; 10]).with_header("trace", "t");
    /// let kept = big.truncated(4);
    /// assert_eq!((kept.payload().len(), kept.headers().len()), (4, 1));
    /// ```
    pub fn truncated(&self, max_bytes: usize) -> Envelope {
        Envelope {
            message_type: self.message_type.clone(),
            id: self.id.clone(),
            payload: self.payload[..self.payload.len().min(max_bytes)].to_vec(),
            headers: self.headers.clone(),
            produced_at: self.produced_at,
            receipt: None,
        }
    }

    /// The claim of the PostgreSQL queue row this envelope was delivered from, if it was: the
    /// guard deletes the row in the transaction that commits the message's handling.
    pub fn queue_receipt(&self) -> Option<&QueueReceipt> {
        self.receipt.as_ref()
    }

    /// This envelope without its queue receipt: the guard leaves the row to the delivery's
    /// acknowledgement (a delivery that several handlers share, each in a transaction of its own,
    /// is settled only once all of them are done).
    pub fn without_queue_receipt(mut self) -> Self {
        self.receipt = None;
        self
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn with_receipt(mut self, receipt: QueueReceipt) -> Self {
        self.receipt = Some(receipt);
        self
    }

    /// The transport headers.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }

    /// The correlation id its headers carry, if any: the `correlation-id` header, or else one
    /// spelled another common way (`correlation_id`, `Correlation-Id`, `x-correlation-id`, ...:
    /// case and `_` or `-` aside, `correlation-id` or `x-correlation-id`).
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::Envelope;
    ///
    /// let sent = Envelope::new("order.paid", "e-1", b"{}".to_vec());
    /// assert_eq!(sent.clone().with_header("X-Correlation-ID", "c-7").correlation_id(), Some("c-7"));
    /// assert_eq!(sent.clone().with_header("correlation_id", "c-8").correlation_id(), Some("c-8"));
    /// assert_eq!(sent.with_header("causation-id", "c-9").correlation_id(), None);
    /// ```
    pub fn correlation_id(&self) -> Option<&str> {
        correlation_id(&self.headers)
    }

    /// Decodes the payload as `M`, with an error that names the type and the position of the problem.
    /// A `Deserialize` implementation of `M` that panics on the payload is an error too.
    ///
    /// ```
    /// use inbox_core::{Envelope, Error, Message};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Shipped {
    ///     #[serde(deserialize_with = "positive")]
    ///     parcels: i64,
    /// }
    /// impl Message for Shipped { const TYPE: &'static str = "shipped"; }
    ///
    /// fn positive<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    ///     let parcels = <i64 as serde::Deserialize>::deserialize(d)?;
    ///     assert!(parcels > 0, "no parcels");
    ///     Ok(parcels)
    /// }
    ///
    /// let envelope = Envelope::new("shipped", "d-1", br#"{"parcels":0}"#.to_vec());
    /// let error = envelope.decode::<Shipped>().err().unwrap();
    /// assert!(matches!(error, Error::Decode { .. }));
    /// assert!(error.to_string().contains("panicked: no parcels"), "{error}");
    /// ```
    pub fn decode<M: crate::Message>(&self) -> Result<M, crate::Error> {
        decode_payload(&self.message_type, &self.payload)
    }
}

/// Decodes `payload` as `M`, the type tagged `message_type`. A `Deserialize` implementation that
/// panics (a `deserialize_with` that unwraps, say) makes it an error like any other: the payload
/// is bad input, to be kept with its bytes and its reason, not the end of the run that read it.
pub(crate) fn decode_payload<M: serde::de::DeserializeOwned>(
    message_type: &str,
    payload: &[u8],
) -> Result<M, crate::Error> {
    let reason = match std::panic::catch_unwind(|| serde_json::from_slice::<M>(payload)) {
        Ok(Ok(message)) => return Ok(message),
        Ok(Err(error)) => error.to_string(),
        Err(panic) => format!("its deserialization panicked: {}", panic_text(&*panic)),
    };
    Err(crate::Error::Decode {
        message_type: message_type.to_owned(),
        reason,
    })
}

/// The text a panic was raised with.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-text panic payload")
}

/// The correlation id in `headers` (see [`Envelope::correlation_id`]). Read for every message
/// handled, so the other spellings are compared in place, without a copy of each header's name.
pub(crate) fn correlation_id(headers: &BTreeMap<String, String>) -> Option<&str> {
    const NAME: &str = "correlation-id";
    let spelled = |name: &str| spelled_as(name, NAME) || spelled_as(name, "x-correlation-id");
    let value = headers.get(NAME).or_else(|| {
        let mut others = headers.iter().filter(|(name, _)| spelled(name));
        others.next().map(|(_, value)| value)
    });
    value.map(String::as_str)
}

/// Whether `name` is `wanted` (lowercase, words joined by `-`) in any case, with `_` or `-`.
fn spelled_as(name: &str, wanted: &str) -> bool {
    let same = |(c, w): (u8, u8)| c.to_ascii_lowercase() == w || (c == b'_' && w == b'-');
    name.len() == wanted.len() && name.bytes().zip(wanted.bytes()).all(same)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::Envelope;
    use crate::Message;
    use crate::outbox::AGGREGATE_ID;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Placed {
        order_id: String,
    }

    impl Message for Placed {
        const TYPE: &'static str = "order.placed";

        fn aggregate(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(&self.order_id))
        }
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ping;

    impl Message for Ping {
        const TYPE: &'static str = "ping";
    }

    #[test]
    fn encode_sets_the_aggregate_id_header_from_the_messages_aggregate() {
        let placed = Placed {
            order_id: "o-1".into(),
        };
        let envelope = Envelope::encode("d-1", &placed).unwrap();
        assert_eq!(
            envelope.headers().get(AGGREGATE_ID).map(String::as_str),
            Some("o-1")
        );
        assert_eq!(envelope.headers().len(), 1);
    }

    #[test]
    fn encode_leaves_the_aggregate_id_header_to_a_later_with_header() {
        let placed = Placed {
            order_id: "o-1".into(),
        };
        let envelope = Envelope::encode("d-1", &placed)
            .unwrap()
            .with_header(AGGREGATE_ID, "custom");
        assert_eq!(envelope.headers()[AGGREGATE_ID], "custom");
    }

    #[test]
    fn encode_sets_no_aggregate_id_header_without_an_aggregate() {
        let envelope = Envelope::encode("d-1", &Ping).unwrap();
        assert!(envelope.headers().is_empty());
    }
}
