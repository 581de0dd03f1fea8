//! What the guard needs to know about one message: its dedup key and its place in a stream.

use std::borrow::Cow;

use crate::error::Error;
use crate::keys::Ordering;

/// The longest message id or aggregate id the inbox accepts, in bytes.
pub const MAX_ID_LEN: usize = 512;

/// The largest sequence the inbox accepts: 2^53 - 1, the largest integer every JSON producer
/// represents exactly. Sequences start at 0 (strict ordering: at 1), so an aggregate's stream can
/// always move past its last sequence, and a bogus sequence is refused at the door instead of
/// making its aggregate stale.
pub const MAX_SEQUENCE: i64 = (1 << 53) - 1;

/// The identity of one message for one handler, read from the fields named in `#[inbox_handler]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    message_id: String,
    aggregate: Option<String>,
    sequence: Option<i64>,
}

impl Identity {
    /// Builds an identity, rejecting an empty or oversized message id or aggregate id, one that
    /// holds a NUL character (which no database stores as text), and a sequence outside
    /// `0..=`[`MAX_SEQUENCE`].
    ///
    /// A key of several fields is stored as a JSON array of their text forms, so that no two
    /// different keys share a stored id.
    ///
    /// ```
    /// use std::borrow::Cow;
    /// # use inbox_core as inbox;
    /// use inbox::Identity;
    ///
    /// let single = Identity::new(&[Cow::Borrowed("evt-1")], None, None).unwrap();
    /// assert_eq!(single.message_id(), "evt-1");
    ///
    /// let composite = Identity::new(&[Cow::Borrowed("a:b"), Cow::Borrowed("c")], None, None).unwrap();
    /// assert_eq!(composite.message_id(), r#"["a:b","c"]"#);
    ///
    /// assert!(Identity::new(&[Cow::Borrowed("")], None, None).is_err());
    /// assert!(Identity::new(&[Cow::Borrowed("a\0")], None, None).is_err());
    /// assert!(Identity::new(&[Cow::Borrowed("a")], Some(Cow::Borrowed("o")), Some(i64::MAX)).is_err());
    /// ```
    pub fn new(
        key: &[Cow<'_, str>],
        aggregate: Option<Cow<'_, str>>,
        sequence: Option<i64>,
    ) -> Result<Self, Error> {
        let message_id = match key {
            [single] => single.to_string(),
            parts => serde_json::to_string(parts).map_err(|e| Error::Encode(e.to_string()))?,
        };
        check_id("message id", &message_id)?;
        let aggregate = aggregate.map(Cow::into_owned);
        if let Some(aggregate) = &aggregate {
            check_id("aggregate id", aggregate)?;
        }
        if let Some(sequence) = sequence {
            check_sequence(sequence, 0)?;
        }
        Ok(Self {
            message_id,
            aggregate,
            sequence,
        })
    }

    /// Checks what `ordering` asks of the sequence beyond [`Identity::new`]: strict ordering
    /// numbers an aggregate's messages from 1.
    pub fn check_ordering(&self, ordering: Ordering) -> Result<(), Error> {
        match (ordering, self.sequence) {
            (Ordering::Strict { .. }, Some(sequence)) => check_sequence(sequence, 1),
            _ => Ok(()),
        }
    }

    /// The dedup key, unique per consumer and handler.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The ordering stream this message belongs to, if the handler names an `aggregate`.
    pub fn aggregate(&self) -> Option<&str> {
        self.aggregate.as_deref()
    }

    /// The message's position in its aggregate's stream, if the handler names a `sequence`.
    pub fn sequence(&self) -> Option<i64> {
        self.sequence
    }
}

fn check_id(what: &'static str, id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::InvalidIdentity {
            what,
            reason: "it is empty".into(),
        });
    }
    if id.contains('\0') {
        return Err(Error::InvalidIdentity {
            what,
            reason: "it contains a NUL character, which the database cannot store".into(),
        });
    }
    if id.len() > MAX_ID_LEN {
        return Err(Error::InvalidIdentity {
            what,
            reason: format!("it is {} bytes long; the limit is {MAX_ID_LEN}", id.len()),
        });
    }
    Ok(())
}

fn check_sequence(sequence: i64, first: i64) -> Result<(), Error> {
    if (first..=MAX_SEQUENCE).contains(&sequence) {
        return Ok(());
    }
    Err(Error::InvalidIdentity {
        what: "sequence",
        reason: format!("it is {sequence}; sequences run from {first} to {MAX_SEQUENCE}"),
    })
}
