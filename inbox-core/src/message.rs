//! The message model: type tags, and the field types that can identify a message, an aggregate or a
//! position in an aggregate's stream.

use std::borrow::Cow;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A message the inbox can route, decode and guard.
///
/// Implement it with `#[derive(Message)]`; the type tag defaults to the type's name and is set with
/// `#[message(name = "order.paid")]`. The tag is what envelopes carry to pick the handlers, so it must
/// stay stable across releases.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an inbox message",
    label = "this type is used as a message but does not implement `Message`",
    note = "add `#[derive(Message)]` (and `Serialize`, `Deserialize`) to the type"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable type tag that envelopes carry for this message.
    const TYPE: &'static str;

    /// The aggregate this message belongs to, which the outbox publishes it in order within
    /// (`#[message(aggregate = "order_id")]`); `None` by default.
    fn aggregate(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// A field type that can identify a message (`key`) or an aggregate (`aggregate`).
///
/// Implemented for strings, integers and UUIDs. Its text form is what the inbox stores.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot identify a message or an aggregate",
    label = "this field's type has no stable text form",
    note = "use a `String`, `&str`, an integer or a `Uuid` field for `key` and `aggregate`"
)]
pub trait Identifier {
    /// The text this value is stored as.
    fn to_identifier(&self) -> Cow<'_, str>;
}

impl Identifier for String {
    fn to_identifier(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl Identifier for str {
    fn to_identifier(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: Identifier + ?Sized> Identifier for &T {
    fn to_identifier(&self) -> Cow<'_, str> {
        (**self).to_identifier()
    }
}

impl Identifier for uuid::Uuid {
    fn to_identifier(&self) -> Cow<'_, str> {
        Cow::Owned(self.hyphenated().to_string())
    }
}

macro_rules! integer_identifiers {
    ($($ty:ty),*) => {$(
        impl Identifier for $ty {
            fn to_identifier(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }
        }
    )*};
}
integer_identifiers!(
    i8, i16, i32, i64, i128, u8, u16, u32, u64, u128, isize, usize
);

/// A field type that can carry a position in an aggregate's stream (`sequence`).
///
/// Implemented for the integer types that fit in a signed 64-bit column without loss.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a sequence number",
    label = "sequence numbers are stored as a signed 64-bit integer",
    note = "use an `i64` (or `i32`, `u32`, or a smaller integer) field for `sequence`"
)]
pub trait SequenceNumber {
    /// The value stored and compared by the ordering guard.
    fn to_sequence(&self) -> i64;
}

macro_rules! sequence_numbers {
    ($($ty:ty),*) => {$(
        impl SequenceNumber for $ty {
            fn to_sequence(&self) -> i64 {
                i64::from(*self)
            }
        }
    )*};
}
sequence_numbers!(i8, i16, i32, i64, u8, u16, u32);
