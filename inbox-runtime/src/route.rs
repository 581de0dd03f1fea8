//! Type erasure: a typed handler becomes a [`Route`] stored by message type tag; an envelope
//! becomes a decoded [`Job`] that knows its aggregate before it runs.

use std::sync::Arc;

use futures::future::BoxFuture;
use inbox_core::batch::{Abandoned, Batch, Entry, InBatch, Staged, Ticket};
use inbox_core::{
    Backend, Connect, Envelope, Error, Guarded, Handler, Identity, Ordering, Outcome, Received,
    RetryPolicy,
};
use sqlx::Pool;
use tracing::Span;

/// The outcome of one handler for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The handler's name.
    pub handler: &'static str,
    /// What the guard decided.
    pub outcome: Outcome,
    /// How many parked successors this message released (strict ordering).
    pub released: u32,
}

/// What [`Inbox::dispatch`](crate::Inbox::dispatch) did with one envelope: each handler of its
/// type, in the order they were registered, with its outcome. It reads as a slice of
/// [`Handled`], and compares equal to an [`Outcome`] when every handler came to that outcome.
///
/// ```
/// use inbox::{Dispatched, Handled, Outcome};
///
/// let credit = Handled { handler: "credit", outcome: Outcome::Processed, released: 0 };
/// let audit = Handled { handler: "audit", outcome: Outcome::Duplicate, released: 0 };
/// let one = Dispatched::from(vec![credit]);
/// assert_eq!(one, Outcome::Processed);
/// assert_eq!(one.outcome(), Some(Outcome::Processed));
///
/// let two = Dispatched::from(vec![credit, audit]);
/// assert_eq!(two.outcome(), None, "the handlers came to different outcomes");
/// assert_eq!(two[1].outcome, Outcome::Duplicate);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched {
    handled: Vec<Handled>,
}

impl Dispatched {
    /// The outcome every handler came to, or `None` when they came to different ones.
    pub fn outcome(&self) -> Option<Outcome> {
        let first = self.handled.first()?.outcome;
        let agreed = self.handled.iter().all(|handled| handled.outcome == first);
        agreed.then_some(first)
    }

    /// Each handler with its outcome.
    pub fn into_handled(self) -> Vec<Handled> {
        self.handled
    }
}

impl From<Vec<Handled>> for Dispatched {
    fn from(handled: Vec<Handled>) -> Self {
        Self { handled }
    }
}

impl std::ops::Deref for Dispatched {
    type Target = [Handled];

    fn deref(&self) -> &[Handled] {
        &self.handled
    }
}

impl PartialEq<Outcome> for Dispatched {
    fn eq(&self, outcome: &Outcome) -> bool {
        self.outcome() == Some(*outcome)
    }
}

impl PartialEq<Dispatched> for Outcome {
    fn eq(&self, dispatched: &Dispatched) -> bool {
        dispatched == self
    }
}

impl IntoIterator for Dispatched {
    type Item = Handled;
    type IntoIter = std::vec::IntoIter<Handled>;

    fn into_iter(self) -> Self::IntoIter {
        self.handled.into_iter()
    }
}

impl<'a> IntoIterator for &'a Dispatched {
    type Item = &'a Handled;
    type IntoIter = std::slice::Iter<'a, Handled>;

    fn into_iter(self) -> Self::IntoIter {
        self.handled.iter()
    }
}

/// A registered handler, without its message type.
pub(crate) trait Route<DB: Backend>: Send + Sync {
    fn name(&self) -> &'static str;
    fn message_type(&self) -> &'static str;
    fn ordering(&self) -> Ordering;
    /// Decodes the payload and reads the identity, ready to run.
    fn prepare(&self, envelope: &Envelope) -> Result<Box<dyn Job<DB>>, Error>;
    /// Releases what a crash left parked behind applied predecessors.
    fn resume<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>>;
    /// Replays a dead message of this handler through the guarded path.
    fn replay<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        message_id: &'a str,
        by_reason: (&'a str, &'a str),
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<Outcome, Error>>;
    /// Retries the failed messages of this handler whose retry is due (requested replays among
    /// them).
    fn retry_due<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>>;
    /// Skips the gap in front of an aggregate's parked messages and releases them.
    fn skip_gap<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        aggregate: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>>;
}

/// One decoded message for one handler.
pub(crate) trait Job<DB: Backend>: Send {
    fn aggregate(&self) -> Option<&str>;
    /// Whether its handler orders messages strictly.
    fn strict(&self) -> bool;
    fn message_id(&self) -> &str;
    /// Guards the message in a transaction of its own.
    fn run<'a>(
        self: Box<Self>,
        connection: &'a mut dyn Connect<DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<Handled, Error>>;
    /// The message as a batch claims it.
    fn entry<'a>(&'a self, envelope: &'a Envelope) -> Entry<'a>;
    /// Guards the message inside `batch`, which it hands on, from what the batch's claim found.
    fn stage<'a>(
        &'a mut self,
        batch: Batch<'a, DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
        ticket: Ticket,
    ) -> BoxFuture<'a, Result<(Batch<'a, DB>, Staged), Abandoned>>;
    /// What the message came to, once its batch ended.
    fn conclude<'a>(
        self: Box<Self>,
        connection: &'a mut dyn Connect<DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
        in_batch: InBatch,
    ) -> BoxFuture<'a, Result<Handled, Error>>;
    fn handler(&self) -> &'static str;
}

pub(crate) struct HandlerRoute<H>(pub Arc<H>);

impl<DB: Backend, H: Handler<DB>> Route<DB> for HandlerRoute<H> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn message_type(&self) -> &'static str {
        <H::Message as inbox_core::Message>::TYPE
    }

    fn ordering(&self) -> Ordering {
        self.0.ordering()
    }

    fn resume<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>> {
        Box::pin(inbox_core::resume(pool, consumer, &*self.0, retry))
    }

    fn skip_gap<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        aggregate: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>> {
        Box::pin(inbox_core::skip_gap(
            pool, consumer, &*self.0, aggregate, retry,
        ))
    }

    fn replay<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        message_id: &'a str,
        by_reason: (&'a str, &'a str),
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(inbox_core::replay(
            pool, consumer, &*self.0, message_id, by_reason, retry,
        ))
    }

    fn retry_due<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<u32, Error>> {
        Box::pin(inbox_core::retry_due(pool, consumer, &*self.0, retry))
    }

    fn prepare(&self, envelope: &Envelope) -> Result<Box<dyn Job<DB>>, Error> {
        let message = envelope.decode::<H::Message>()?;
        let identity = self.0.identity(&message)?;
        identity.check_ordering(self.0.ordering())?;
        Ok(Box::new(HandlerJob {
            handler: Arc::clone(&self.0),
            message: Some(message),
            identity,
            span: None,
        }))
    }
}

/// One handler's decoded message. A batch abandoned after the handler ran hands the job on
/// without its message, which is then decoded again, and with its span, which the message keeps
/// (one span per delivery and handler, however many times a batch had it run).
struct HandlerJob<H: Handler<DB>, DB: Backend> {
    handler: Arc<H>,
    message: Option<H::Message>,
    identity: Identity,
    span: Option<Span>,
}

impl<DB: Backend, H: Handler<DB>> HandlerJob<H, DB> {
    /// The decoded message, or, once a run in an abandoned batch took it, decoded again.
    fn message(&mut self, envelope: &Envelope) -> Result<H::Message, Error> {
        match self.message.take() {
            Some(message) => Ok(message),
            None => envelope.decode::<H::Message>(),
        }
    }

    /// The message's span, made on its first run.
    fn span(&mut self, consumer: &str, envelope: &Envelope) -> Span {
        if let Some(span) = &self.span {
            return span.clone();
        }
        let span = inbox_core::message_span(consumer, &*self.handler, &self.received(envelope));
        self.span.insert(span).clone()
    }

    fn received<'a>(&'a self, envelope: &'a Envelope) -> Received<'a> {
        Received {
            payload: envelope.payload(),
            identity: &self.identity,
            headers: Some(envelope.headers()),
            receipt: envelope.queue_receipt(),
        }
    }

    fn handled(&self, guarded: Guarded) -> Handled {
        Handled {
            handler: self.handler.name(),
            outcome: guarded.outcome,
            released: guarded.released,
        }
    }
}

impl<DB: Backend, H: Handler<DB>> Job<DB> for HandlerJob<H, DB> {
    fn aggregate(&self) -> Option<&str> {
        self.identity.aggregate()
    }

    fn message_id(&self) -> &str {
        self.identity.message_id()
    }

    fn strict(&self) -> bool {
        matches!(self.handler.ordering(), Ordering::Strict { .. })
    }

    fn handler(&self) -> &'static str {
        self.handler.name()
    }

    fn run<'a>(
        mut self: Box<Self>,
        connection: &'a mut dyn Connect<DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
    ) -> BoxFuture<'a, Result<Handled, Error>> {
        Box::pin(async move {
            let message = self.message(envelope)?;
            let span = self.span(consumer, envelope);
            let (handler, received) = (&*self.handler, self.received(envelope));
            let guarded = inbox_core::process_in(
                connection, consumer, handler, message, received, retry, &span,
            );
            Ok(self.handled(guarded.await?))
        })
    }

    fn entry<'a>(&'a self, envelope: &'a Envelope) -> Entry<'a> {
        Entry::new(&*self.handler, self.received(envelope))
    }

    fn stage<'a>(
        &'a mut self,
        batch: Batch<'a, DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
        ticket: Ticket,
    ) -> BoxFuture<'a, Result<(Batch<'a, DB>, Staged), Abandoned>> {
        Box::pin(async move {
            let message = self.message(envelope).map_err(|_| Abandoned::Refused)?;
            let ticket = ticket.in_span(self.span(consumer, envelope));
            let (handler, received) = (&*self.handler, self.received(envelope));
            batch
                .guard(consumer, handler, message, received, retry, ticket)
                .await
        })
    }

    fn conclude<'a>(
        mut self: Box<Self>,
        connection: &'a mut dyn Connect<DB>,
        consumer: &'a str,
        envelope: &'a Envelope,
        retry: &'a RetryPolicy,
        in_batch: InBatch,
    ) -> BoxFuture<'a, Result<Handled, Error>> {
        Box::pin(async move {
            let span = self.span(consumer, envelope);
            let (handler, received) = (&*self.handler, self.received(envelope));
            let concluded = inbox_core::batch::conclude(
                connection, consumer, handler, received, retry, in_batch, &span,
            );
            Ok(self.handled(concluded.await?))
        })
    }
}
