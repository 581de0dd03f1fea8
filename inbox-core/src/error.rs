//! Errors of the inbox and of user handlers.

use std::fmt;

/// Everything that can go wrong while guarding and handling a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database failed; the message was not marked processed and can be redelivered.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// The inbox schema could not be applied.
    #[error("could not apply the inbox schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The handler failed (an error or a panic); its writes were rolled back and the failure was
    /// recorded with the message: it is retried after `retry_after`, or, with `None`, it is dead
    /// (attempts exhausted or a permanent error) and kept for an operator.
    #[error("handler `{handler}` failed (attempt {attempt}): {error}")]
    Handler {
        /// The handler's name (its dedup scope).
        handler: &'static str,
        /// What the handler returned.
        error: HandlerError,
        /// Which attempt failed (1 for the first).
        attempt: u32,
        /// When to try again; `None` if the message is dead.
        retry_after: Option<std::time::Duration>,
    },

    /// The handler's database connection was lost under it (closed, reset, or ended by the
    /// server): not the handler's failure, so nothing was recorded and no attempt counted; its
    /// writes were rolled back, and the delivery comes again after a delay.
    #[error("handler `{handler}` lost its database connection: {error}")]
    ConnectionLost {
        /// The handler's name.
        handler: &'static str,
        /// What the handler returned.
        error: HandlerError,
    },

    /// The handler did not run the message: an earlier message of its aggregate, in the same
    /// batch, ended before anything of it could be recorded (the database unreachable or
    /// refusing writes), and this one waits to come after it. Nothing was recorded, no attempt
    /// counted.
    #[error(
        "handler `{handler}` did not run the message: an earlier one of `{aggregate}` is to be tried again first"
    )]
    Behind {
        /// The handler's name.
        handler: &'static str,
        /// The aggregate (or, for a handler without one, the message id).
        aggregate: String,
    },

    /// The message failed before and its next attempt is not due yet: nothing ran and no attempt
    /// was counted. The delivery can come back after `retry_after`; the runtime also retries the
    /// message from the store when it is due, whether or not the broker redelivers it.
    #[error(
        "message `{message_id}` of handler `{handler}` failed before; its next attempt is due in {retry_after:?}"
    )]
    RetryNotDue {
        /// The handler's name.
        handler: String,
        /// The dedup key.
        message_id: String,
        /// How long until the retry is due.
        retry_after: std::time::Duration,
    },

    /// The message's key, aggregate or sequence field holds a value the inbox cannot use.
    #[error("invalid {what}: {reason}")]
    InvalidIdentity {
        /// `message id`, `aggregate id` or `sequence`.
        what: &'static str,
        /// Why the value was refused.
        reason: String,
    },

    /// The payload is not a valid encoding of the message type its envelope names.
    #[error("cannot decode a `{message_type}` payload: {reason}")]
    Decode {
        /// The type tag from the envelope.
        message_type: String,
        /// The decoder's explanation, with the position of the problem.
        reason: String,
    },

    /// A message could not be encoded to compute its payload hash.
    #[error("cannot encode the message: {0}")]
    Encode(String),

    /// An operator asked to replay or discard a message that is not dead (or failed).
    #[error(
        "message `{message_id}` of handler `{handler}` is not dead, so there is nothing to {action}"
    )]
    NotDead {
        /// The handler.
        handler: String,
        /// The message.
        message_id: String,
        /// `replay` or `discard`.
        action: &'static str,
    },

    /// No handler of this name is registered.
    #[error("no handler named `{0}` is registered")]
    UnknownHandler(String),

    /// The payload is larger than the inbox accepts.
    #[error("the payload is {size} bytes; the limit is {limit}")]
    PayloadTooLarge {
        /// The payload's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// No rejected delivery with this number waits for an operator.
    #[error("no unresolved rejected delivery has number {0}")]
    UnknownRejected(i64),

    /// No handler is registered for the envelope's type tag.
    #[error("no handler is registered for message type `{0}`")]
    UnknownMessageType(String),

    /// The source could not read the delivery as a message (it has no type tag, say).
    #[error("the delivery is not a message the inbox can read: {0}")]
    Unreadable(String),
}

impl Error {
    /// Whether trying the same delivery again later can succeed: a database that is unreachable,
    /// read-only, out of space or in a serialization conflict. Everything about the message itself
    /// (a payload that does not decode, an unusable id or sequence, a value the database refuses
    /// as data) is not transient: retrying it gives the same error, so the runtime keeps such a
    /// delivery as rejected instead of handing it back.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::Error;
    ///
    /// assert!(Error::Database(sqlx::Error::PoolTimedOut).is_transient());
    /// let bad = Error::Decode { message_type: "order.paid".into(), reason: "EOF".into() };
    /// assert!(!bad.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::Database(error)) => !refuses_input(error.as_ref()),
            Error::Database(_) | Error::Migrate(_) => true,
            Error::Handler {
                retry_after: Some(_),
                ..
            }
            | Error::RetryNotDue { .. }
            | Error::ConnectionLost { .. }
            | Error::Behind { .. } => true,
            _ => false,
        }
    }

    /// Whether this error ended a try before its failure could be recorded, for a reason that may
    /// pass (the database unreachable or refusing writes, the connection lost): nothing of the try
    /// is kept, and it can only be tried again. A handler's failure ([`Error::Handler`]) and a
    /// retry that is not due ([`Error::RetryNotDue`]) are recorded already.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::Error;
    ///
    /// assert!(Error::Database(sqlx::Error::PoolTimedOut).is_unrecorded());
    /// let not_due = Error::RetryNotDue {
    ///     handler: "mark_paid".into(),
    ///     message_id: "e-1".into(),
    ///     retry_after: std::time::Duration::from_secs(1),
    /// };
    /// assert!(!not_due.is_unrecorded());
    /// ```
    pub fn is_unrecorded(&self) -> bool {
        let recorded = matches!(self, Error::Handler { .. } | Error::RetryNotDue { .. });
        !recorded && self.is_transient()
    }

    /// Whether the database was out of reach: no connection to be had (refused, timed out, the
    /// pool closed) or the connection lost under the transaction, or the message did not run at
    /// all ([`Error::Behind`]). Such a failure says nothing about the message, so the runtime
    /// keeps trying it however long the outage lasts, counting no try against it.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::Error;
    ///
    /// assert!(Error::Database(sqlx::Error::PoolTimedOut).is_unreachable());
    /// let answered = Error::Database(sqlx::Error::RowNotFound);
    /// assert!(answered.is_transient() && !answered.is_unreachable());
    /// ```
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_)) => true,
            Error::Database(error) => connection_lost(error),
            Error::ConnectionLost { .. } | Error::Behind { .. } => true,
            _ => false,
        }
    }
}

/// Whether the database refused a value as data: PostgreSQL's class 22 (data exception: a NUL
/// byte, invalid UTF-8, a value out of range), or SQLite's `TOOBIG`, `MISMATCH` and `RANGE`.
fn refuses_input(error: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = error.code() else {
        return false;
    };
    // PostgreSQL's SQLSTATEs are five characters; SQLite's (extended) result codes are shorter.
    if code.len() == 5 {
        return code.starts_with("22");
    }
    code.parse::<u32>()
        .is_ok_and(|sqlite| matches!(sqlite & 0xff, 18 | 20 | 25))
}

/// The error a handler returns. Any `std::error::Error + Send + Sync + 'static` converts into it with
/// `?`, so handlers can use `sqlx` and their own errors directly.
///
/// ```
/// # use inbox_core as inbox;
/// use inbox::HandlerError;
///
/// fn parse(amount: &str) -> Result<i64, HandlerError> {
///     Ok(amount.parse::<i64>()?)
/// }
/// assert!(parse("12").is_ok());
/// assert_eq!(parse("x").unwrap_err().to_string(), "invalid digit found in string");
///
/// let err = HandlerError::msg("order 7 is closed");
/// assert_eq!(err.to_string(), "order 7 is closed");
/// ```
///
/// A handler may also return its own error type, `anyhow::Error`, or a boxed error: whatever
/// converts into `Box<dyn std::error::Error + Send + Sync>`. Its own type says which of its values
/// are permanent by implementing [`Permanence`].
///
/// `HandlerError` does not implement `std::error::Error` itself, for the reason `anyhow::Error`
/// does not: it could not then convert from every error with `?`. It converts into
/// `Box<dyn Error>` instead, so a test returning `Result<(), Box<dyn Error>>` can call a handler
/// with `?`:
///
/// ```
/// # use inbox_core as inbox;
/// use inbox::HandlerError;
///
/// fn check(amount: i64) -> Result<(), HandlerError> {
///     if amount < 0 { return Err(HandlerError::msg("a negative amount")); }
///     Ok(())
/// }
///
/// fn test() -> Result<(), Box<dyn std::error::Error>> {
///     check(5)?;
///     check(-1)?;
///     Ok(())
/// }
/// assert_eq!(test().unwrap_err().to_string(), "a negative amount");
/// ```
pub struct HandlerError {
    inner: Box<dyn std::error::Error + Send + Sync + 'static>,
    permanent: bool,
}

/// An error that retrying cannot fix is *permanent*: the message is dead at once instead of
/// being retried. A handler that returns its own error type implements this to say which of its
/// values are permanent; every value is transient by default.
///
/// ```
/// # use inbox_core as inbox;
/// use inbox::Permanence;
///
/// #[derive(Debug, thiserror::Error)]
/// enum ShopError {
///     #[error("order {0} does not exist")]
///     UnknownOrder(String),
///     #[error(transparent)]
///     Database(#[from] sqlx::Error),
/// }
///
/// impl Permanence for ShopError {
///     fn is_permanent(&self) -> bool {
///         matches!(self, ShopError::UnknownOrder(_))
///     }
/// }
/// # assert!(ShopError::UnknownOrder("o-7".into()).is_permanent());
/// ```
///
/// A handler returning `Result<(), ShopError>` then has an unknown order dead at its first
/// attempt, and a database error retried by the retry policy. (Inside a handler that returns
/// `HandlerError`, `?` cannot see this trait; wrap with [`HandlerError::permanent`] there.)
pub trait Permanence {
    /// Whether retrying cannot help. The default: every value is transient.
    fn is_permanent(&self) -> bool {
        false
    }
}

impl HandlerError {
    /// An error carrying only a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self::new(message.to_string())
    }

    /// Wraps any error (or a message: `String` and `&str` convert too), as transient. A
    /// `HandlerError` that went through a `Box<dyn Error>` is recovered as it was.
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        match error.into().downcast::<Boxed>() {
            Ok(boxed) => boxed.0,
            Err(inner) => Self {
                inner,
                permanent: false,
            },
        }
    }

    /// An error that no retry can fix (a rule the message breaks, say): the message is dead at
    /// once instead of being retried.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::HandlerError;
    ///
    /// let error = HandlerError::permanent("order 7 does not exist");
    /// assert!(error.is_permanent());
    /// assert!(!HandlerError::msg("timeout").is_permanent());
    /// ```
    pub fn permanent(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self {
            permanent: true,
            ..Self::new(error)
        }
    }

    /// Whether retrying cannot help. Every other error is retried, by the retry policy.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The underlying error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// This failure, from a handler whose transaction's connection is still there (it rolled
    /// back): an error that says a connection was lost came from another one (a second pool, a
    /// `dblink` to a server that is down), so it is the handler's failure like any other,
    /// recorded and retried within the policy's attempts, and kept with its text.
    pub(crate) fn charged_to_the_handler(self) -> Self {
        match self.lost_connection() {
            true => HandlerError::msg(format!(
                "{self} (not the inbox's connection, which answers)"
            )),
            false => self,
        }
    }

    /// Whether the handler failed because its database connection was lost: a `sqlx` error in
    /// its chain of sources that says the connection broke, closed, or was ended by the server
    /// (PostgreSQL's SQLSTATE class 08 and 57P01-57P03, MySQL's 08 and killed connections).
    pub(crate) fn lost_connection(&self) -> bool {
        database_causes(self.get_ref()).any(|cause| match cause {
            Cause::Sqlx(error) => connection_lost(error),
            Cause::Database(error) => error.code().is_some_and(|code| lost_by(&code)),
        })
    }
}

/// Whether `error` says the connection it ran on is gone.
pub(crate) fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(error) => error.code().is_some_and(|code| lost_by(&code)),
        _ => false,
    }
}

/// Whether the database's error `code` says the connection is gone: PostgreSQL's class 08 and
/// 57P01-57P03 (the server ended it), MySQL's class 08 and 70100 (the connection was killed).
fn lost_by(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "70100")
}

/// A link of a chain of error sources that the database or `sqlx` put there.
pub(crate) enum Cause<'a> {
    /// A `sqlx` error.
    Sqlx(&'a sqlx::Error),
    /// The database's own error, reached without the `sqlx::Error` that held it.
    Database(&'a dyn sqlx::error::DatabaseError),
}

impl Cause<'_> {
    /// The database's code for the error (a SQLSTATE, or SQLite's result code), if it has one.
    pub(crate) fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        match self {
            Cause::Sqlx(error) => error.as_database_error()?.code(),
            Cause::Database(error) => error.code(),
        }
    }
}

/// The links of `error`'s chain of sources that the database or `sqlx` put there, however the
/// handler wrapped them: an error type with `#[error(transparent)]` around a `sqlx::Error`
/// forwards `source()` past it, straight to the database error it holds, and that is found all
/// the same.
pub(crate) fn database_causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = Cause<'a>> {
    std::iter::successors(Some(error), |error| error.source()).filter_map(|error| {
        if let Some(sqlx) = error.downcast_ref::<sqlx::Error>() {
            return Some(Cause::Sqlx(sqlx));
        }
        let database = error.downcast_ref::<Box<dyn sqlx::error::DatabaseError>>()?;
        Some(Cause::Database(&**database))
    })
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self {
            inner: Box::new(error),
            permanent: false,
        }
    }
}

/// A `HandlerError` as a `std::error::Error`, inside the boxes it converts into; downcast back by
/// [`HandlerError::new`], so its permanence survives the trip.
struct Boxed(HandlerError);

impl fmt::Debug for Boxed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Boxed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Boxed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.inner.source()
    }
}

impl From<HandlerError> for Box<dyn std::error::Error + Send + Sync + 'static> {
    fn from(error: HandlerError) -> Self {
        Box::new(Boxed(error))
    }
}

impl From<HandlerError> for Box<dyn std::error::Error + 'static> {
    fn from(error: HandlerError) -> Self {
        Box::new(Boxed(error))
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

/// How generated code turns a handler's error into a [`HandlerError`]: an error type that
/// implements [`Permanence`] is asked (the first impl, found through one more reference), any
/// other is transient. Not public API.
#[doc(hidden)]
pub mod classify {
    use super::{HandlerError, Permanence};

    type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

    /// A handler's error on its way into a [`HandlerError`], with how to box it.
    pub struct Failure<E> {
        error: core::cell::Cell<Option<E>>,
        boxed: fn(E) -> BoxError,
    }

    impl<E> Failure<E> {
        /// Wraps the error; `boxed` converts it.
        pub fn new(error: E, boxed: fn(E) -> BoxError) -> Self {
            Self {
                error: core::cell::Cell::new(Some(error)),
                boxed,
            }
        }

        /// The error and whether `permanent` calls it permanent, once (a later call has only a
        /// message saying that it was taken).
        fn take(&self, permanent: impl FnOnce(&E) -> bool) -> HandlerError {
            match self.error.take() {
                Some(error) if permanent(&error) => HandlerError::permanent((self.boxed)(error)),
                Some(error) => HandlerError::new((self.boxed)(error)),
                None => HandlerError::msg("the handler's error was already taken"),
            }
        }
    }

    /// Chosen when the error type implements [`Permanence`].
    pub trait Classified {
        /// The error, permanent if its type says so.
        fn take_handler_error(&self) -> HandlerError;
    }

    impl<E: Permanence> Classified for &Failure<E> {
        fn take_handler_error(&self) -> HandlerError {
            self.take(E::is_permanent)
        }
    }

    /// Chosen for every other error type.
    pub trait Unclassified {
        /// The error, as it is (a `HandlerError` keeps its permanence), else transient.
        fn take_handler_error(&self) -> HandlerError;
    }

    impl<E> Unclassified for Failure<E> {
        fn take_handler_error(&self) -> HandlerError {
            self.take(|_| false)
        }
    }
}
