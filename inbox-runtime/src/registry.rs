//! The handlers of one inbox, by message type tag.

use std::collections::HashMap;
use std::sync::Arc;

use inbox_core::{Backend, Envelope, Error, Ordering};

use crate::route::{Job, Route};

/// The longest consumer name the inbox tables keep, in characters.
pub(crate) const MAX_CONSUMER_CHARS: usize = 100;
/// The longest handler name the inbox tables keep, in characters.
const MAX_HANDLER_CHARS: usize = 100;
/// The longest message type tag the inbox tables keep, in characters.
const MAX_TYPE_CHARS: usize = 255;

/// An error in how an inbox was put together, found by [`crate::InboxBuilder::build`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two registrations share a handler name, so they would share one dedup scope.
    #[error(
        "handler `{name}` is registered twice (for `{first}` and `{second}`); each handler is its own dedup scope, so register it once or give the other one a distinct `name = \"...\"`"
    )]
    DuplicateHandler {
        /// The shared name.
        name: &'static str,
        /// The message type of the first registration.
        first: &'static str,
        /// The message type of the second registration.
        second: &'static str,
    },

    /// No handler is registered, so every delivery would be refused.
    #[error("the inbox has no handlers; register each with `.handler(..)` before `.build()`")]
    NoHandlers,

    /// A retry policy is set for a handler the inbox does not register.
    #[error(
        "`retry_for` sets a policy for handler `{0}`, which is not registered; register it with `.handler({0})` too"
    )]
    RetryForUnregistered(&'static str),

    /// The consumer name is empty.
    #[error("the consumer name is empty; name the consumer group, like `.consumer(\"billing\")`")]
    EmptyConsumer,

    /// The consumer name is longer than the inbox tables keep (MySQL's key columns hold 100
    /// characters; the limit is the same on every database).
    #[error(
        "the consumer name is {0} characters long; the inbox keeps names of at most {max}, so shorten it",
        max = MAX_CONSUMER_CHARS
    )]
    ConsumerTooLong(usize),

    /// A handler's name is longer than the inbox tables keep (MySQL's key columns hold 100
    /// characters; the limit is the same on every database).
    #[error(
        "handler `{name}` has a name {chars} characters long; the inbox keeps names of at most {max}, so give it a shorter `name = \"...\"`",
        max = MAX_HANDLER_CHARS
    )]
    HandlerNameTooLong {
        /// The handler's name.
        name: &'static str,
        /// How many characters it has.
        chars: usize,
    },

    /// A message type tag is longer than the inbox tables keep (255 characters on every
    /// database).
    #[error(
        "message type `{message_type}` is {chars} characters long; the inbox keeps type tags of at most {max}, so give it a shorter `#[message(name = \"...\")]`",
        max = MAX_TYPE_CHARS
    )]
    MessageTypeTooLong {
        /// The type tag.
        message_type: &'static str,
        /// How many characters it has.
        chars: usize,
    },

    /// The inbox tables are missing or unreachable.
    #[error("the inbox schema is missing or unreachable ({0}); run `inbox::migrate(&pool)` first")]
    Schema(#[source] sqlx::Error),

    /// A table of the inbox lacks a unique key the inbox relies on (a schema applied by hand).
    #[error("the inbox schema is incomplete: {0}")]
    IncompleteSchema(inbox_core::storage::schema::SchemaError),
}

/// Message type tag → the handlers of that type, in registration order.
pub(crate) struct Registry<DB: Backend> {
    routes: HashMap<&'static str, Vec<Arc<dyn Route<DB>>>>,
}

/// Fails for a handler name or a type tag longer than the inbox tables keep, on every database
/// alike (instead of MySQL alone refusing each of its messages).
fn check_lengths<DB: Backend>(route: &dyn Route<DB>) -> Result<(), BuildError> {
    let (name, message_type) = (route.name(), route.message_type());
    let chars = name.chars().count();
    if chars > MAX_HANDLER_CHARS {
        return Err(BuildError::HandlerNameTooLong { name, chars });
    }
    let chars = message_type.chars().count();
    if chars > MAX_TYPE_CHARS {
        return Err(BuildError::MessageTypeTooLong {
            message_type,
            chars,
        });
    }
    Ok(())
}

/// A strict handler's name and gap timeout.
pub(crate) struct StrictRoute<'a, DB: Backend> {
    pub(crate) route: &'a Arc<dyn Route<DB>>,
    pub(crate) gap_timeout: std::time::Duration,
}

impl<DB: Backend> Registry<DB> {
    /// Builds the registry, refusing two routes with one handler name.
    pub(crate) fn new(routes: Vec<Arc<dyn Route<DB>>>) -> Result<Self, BuildError> {
        if routes.is_empty() {
            return Err(BuildError::NoHandlers);
        }
        let mut by_name: HashMap<&'static str, &'static str> = HashMap::new();
        let mut by_type: HashMap<&'static str, Vec<Arc<dyn Route<DB>>>> = HashMap::new();
        for route in routes {
            check_lengths(route.as_ref())?;
            if let Some(first) = by_name.insert(route.name(), route.message_type()) {
                return Err(BuildError::DuplicateHandler {
                    name: route.name(),
                    first,
                    second: route.message_type(),
                });
            }
            by_type.entry(route.message_type()).or_default().push(route);
        }
        Ok(Self { routes: by_type })
    }

    /// Every registered handler.
    pub(crate) fn routes(&self) -> impl Iterator<Item = &Arc<dyn Route<DB>>> {
        self.routes.values().flatten()
    }

    /// The handlers with strict ordering.
    pub(crate) fn strict(&self) -> impl Iterator<Item = StrictRoute<'_, DB>> {
        self.routes().filter_map(|route| match route.ordering() {
            Ordering::Strict { gap_timeout } => Some(StrictRoute { route, gap_timeout }),
            Ordering::Monotonic => None,
        })
    }

    /// The handler named `name`.
    pub(crate) fn named(&self, name: &str) -> Result<&Arc<dyn Route<DB>>, Error> {
        self.routes()
            .find(|route| route.name() == name)
            .ok_or_else(|| Error::UnknownHandler(name.to_owned()))
    }

    /// Decodes `envelope` once for each handler of its type.
    pub(crate) fn prepare(&self, envelope: &Envelope) -> Result<Vec<Box<dyn Job<DB>>>, Error> {
        let routes = self
            .routes
            .get(envelope.message_type())
            .ok_or_else(|| Error::UnknownMessageType(envelope.message_type().to_owned()))?;
        routes.iter().map(|route| route.prepare(envelope)).collect()
    }
}
