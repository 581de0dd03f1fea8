//! Type erasure: a typed handler becomes a [`Route`] stored by message type tag; an envelope
//! becomes a decoded [`Job`] that knows its aggregate before it runs.

use std::sync::Arc;

use futures::future::BoxFuture;
use inbox_core::{Backend, Envelope, Error, Handler, Headers, Identity, Outcome};
use sqlx::Pool;

/// The outcome of one handler for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The handler's name.
    pub handler: &'static str,
    /// What the guard decided.
    pub outcome: Outcome,
}

/// A registered handler, without its message type.
pub(crate) trait Route<DB: Backend>: Send + Sync {
    fn name(&self) -> &'static str;
    fn message_type(&self) -> &'static str;
    /// Decodes the payload and reads the identity, ready to run.
    fn prepare(&self, envelope: &Envelope) -> Result<Box<dyn Job<DB>>, Error>;
}

/// One decoded message for one handler.
pub(crate) trait Job<DB: Backend>: Send {
    fn aggregate(&self) -> Option<&str>;
    fn run<'a>(
        self: Box<Self>,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<Handled, Error>>;
}

pub(crate) struct HandlerRoute<H>(pub Arc<H>);

impl<DB: Backend, H: Handler<DB>> Route<DB> for HandlerRoute<H> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn message_type(&self) -> &'static str {
        <H::Message as inbox_core::Message>::TYPE
    }

    fn prepare(&self, envelope: &Envelope) -> Result<Box<dyn Job<DB>>, Error> {
        let message = envelope.decode::<H::Message>()?;
        let identity = self.0.identity(&message)?;
        Ok(Box::new(HandlerJob {
            handler: Arc::clone(&self.0),
            message,
            identity,
        }))
    }
}

struct HandlerJob<H: Handler<DB>, DB: Backend> {
    handler: Arc<H>,
    message: H::Message,
    identity: Identity,
}

impl<DB: Backend, H: Handler<DB>> Job<DB> for HandlerJob<H, DB> {
    fn aggregate(&self) -> Option<&str> {
        self.identity.aggregate()
    }

    fn run<'a>(
        self: Box<Self>,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<Handled, Error>> {
        Box::pin(async move {
            let handler = &*self.handler;
            let outcome = inbox_core::process(
                pool,
                consumer,
                handler,
                self.message,
                &self.identity,
                Some(headers),
            )
            .await?;
            Ok(Handled {
                handler: handler.name(),
                outcome,
            })
        })
    }
}
