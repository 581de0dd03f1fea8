//! What a handler receives besides its message: the open transaction and the delivery's metadata.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::LazyLock;

use sqlx::{Database, Transaction};

use crate::identity::Identity;

static NO_HEADERS: BTreeMap<String, String> = BTreeMap::new();

/// The identity of a context made by [`Context::new`]: message id `test`.
static TEST_IDENTITY: LazyLock<Identity> = LazyLock::new(|| {
    Identity::new(&[std::borrow::Cow::Borrowed("test")], None, None)
        .expect("`test` is a valid message id")
});

/// The guarded transaction of one message, with the message's metadata.
///
/// A handler that takes `&mut Context<'_, DB>` as its first parameter gets this; it dereferences to
/// the connection of the open transaction, so `query.execute(&mut **ctx)` runs inside the guarded
/// transaction.
pub struct Context<'t, DB: Database> {
    tx: Transaction<'t, DB>,
    consumer: &'t str,
    handler: &'static str,
    identity: &'t Identity,
    headers: &'t BTreeMap<String, String>,
    attempt: u32,
}

impl<'t, DB: Database> Context<'t, DB> {
    /// A context on `tx` outside any guard, to call a handler that takes `&mut Context` as a plain
    /// function in a unit test: consumer `default`, handler `test`, message id `test`, attempt
    /// 1, no headers (the `with_` methods set them). Nothing is deduplicated or recorded; the
    /// handler's writes are in `tx`, which [`Context::into_transaction`] gives back to commit or
    /// inspect.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::Context;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), sqlx::Error> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let mut ctx = Context::new(pool.begin().await?).with_attempt(2);
    /// assert_eq!((ctx.message_id(), ctx.attempt()), ("test", 2));
    /// sqlx::query("CREATE TABLE t (x INTEGER)").execute(&mut *ctx).await?;
    /// ctx.into_transaction().commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn new(tx: Transaction<'t, DB>) -> Self {
        Self::guarded(tx, crate::DEFAULT_CONSUMER, "test", &TEST_IDENTITY, None, 1)
    }

    /// This context with another attempt number.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// This context with the delivery's transport headers.
    pub fn with_headers(mut self, headers: &'t BTreeMap<String, String>) -> Self {
        self.headers = headers;
        self
    }

    /// This context with a message's identity (its key, aggregate and sequence).
    pub fn with_identity(mut self, identity: &'t Identity) -> Self {
        self.identity = identity;
        self
    }

    /// The context of one guarded message.
    pub(crate) fn guarded(
        tx: Transaction<'t, DB>,
        consumer: &'t str,
        handler: &'static str,
        identity: &'t Identity,
        headers: Option<&'t BTreeMap<String, String>>,
        attempt: u32,
    ) -> Self {
        Self {
            tx,
            consumer,
            handler,
            identity,
            headers: headers.unwrap_or(&NO_HEADERS),
            attempt,
        }
    }

    /// Ends the context, giving back its transaction (to commit or roll back).
    pub fn into_transaction(self) -> Transaction<'t, DB> {
        self.tx
    }

    /// The guarded transaction itself.
    pub fn transaction(&mut self) -> &mut Transaction<'t, DB> {
        &mut self.tx
    }

    /// The consumer group this message is handled for.
    pub fn consumer(&self) -> &str {
        self.consumer
    }

    /// The handler's name: its dedup scope.
    pub fn handler(&self) -> &'static str {
        self.handler
    }

    /// The dedup key read from the message's `key` fields.
    pub fn message_id(&self) -> &str {
        self.identity.message_id()
    }

    /// The aggregate read from the message's `aggregate` field, if the handler names one.
    pub fn aggregate(&self) -> Option<&str> {
        self.identity.aggregate()
    }

    /// The sequence read from the message's `sequence` field, if the handler names one.
    pub fn sequence(&self) -> Option<i64> {
        self.identity.sequence()
    }

    /// Which attempt this is: 1 the first time, 2 on the first retry after a failure.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The transport headers of the delivery (empty for `Process::process`).
    pub fn headers(&self) -> &BTreeMap<String, String> {
        self.headers
    }
}

impl<DB: crate::Backend> Context<'_, DB> {
    /// Writes `message` to the outbox in the guarded transaction: it is published (by a relay)
    /// if and only if this message's handling commits. It carries the handled message's
    /// correlation id ([`outbox::CORRELATION_ID`](crate::outbox::CORRELATION_ID), or its id if it
    /// had none) and its id as causation id. Gives the id it is published under.
    pub fn publish(
        &mut self,
        message: impl crate::outbox::IntoOutgoing,
    ) -> impl Future<Output = Result<String, crate::Error>> + Send + '_ {
        let outgoing = message
            .into_outgoing()
            .and_then(crate::outbox::Outgoing::checked)
            .map(|outgoing| outgoing.caused_by(self.identity.message_id(), self.headers));
        async move { crate::outbox::write::<DB>(&mut self.tx, &outgoing?).await }
    }
}

impl<DB: Database> Deref for Context<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl<DB: Database> DerefMut for Context<'_, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// A type a handler can take (behind `&mut`) as its first parameter to write in the guarded
/// transaction of database `DB`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handle on a `{DB}` database that an inbox handler can take",
    label = "the first parameter must be a database handle",
    note = "use `&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection`, `&mut sqlx::MySqlConnection`, `&mut sqlx::Transaction<'_, DB>` or `&mut inbox::Context<'_, DB>`, or take only the message"
)]
pub trait DatabaseHandle<'t, DB: crate::Backend> {
    /// Borrows this handle out of the guarded context.
    fn from_context<'c>(ctx: &'c mut Context<'t, DB>) -> &'c mut Self;
}

impl<'t, DB: crate::Backend> DatabaseHandle<'t, DB> for Transaction<'t, DB> {
    fn from_context<'c>(ctx: &'c mut Context<'t, DB>) -> &'c mut Self {
        &mut ctx.tx
    }
}

impl<'t, DB: crate::Backend> DatabaseHandle<'t, DB> for Context<'t, DB> {
    fn from_context<'c>(ctx: &'c mut Context<'t, DB>) -> &'c mut Self {
        ctx
    }
}
