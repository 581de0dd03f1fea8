//! The forms `#[inbox_handler]` and `#[derive(Message)]` accept, a module each: every one compiles,
//! and its test checks what the macros made of it. The forms they reject, and the errors they get,
//! are the compile-fail cases of `inbox-macros/tests/ui.rs`.

use inbox::prelude::*;

/// The message most forms take: every field any of them reads.
#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

// A handler may return `anyhow::Result<()>`.
mod anyhow_result {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> anyhow::Result<()> {
        anyhow::ensure!(!msg.order_id.is_empty(), "an order id is required");
        sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
            .bind(&msg.order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// A composite key: the dedup identity is several fields together.
mod composite_key {
    use inbox::prelude::*;

    #[derive(Debug, Clone, Serialize, Deserialize, Message)]
    struct InvoiceIssued {
        tenant: String,
        event_id: u64,
        invoice: i32,
    }

    #[inbox_handler(key = ["tenant", "event_id"])]
    async fn record_invoice(
        tx: &mut sqlx::SqliteConnection,
        msg: InvoiceIssued,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO invoices (tenant, id) VALUES ($1, $2)")
            .bind(msg.tenant)
            .bind(msg.invoice)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Sqlite, Message = InvoiceIssued>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(record_invoice);
    }
}

// A handler on `&mut inbox::Context<'_, DB>`: the transaction plus the message's metadata.
mod context {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
    async fn mark_paid(
        ctx: &mut inbox::Context<'_, sqlx::Sqlite>,
        msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        let _aggregate: Option<&str> = ctx.aggregate();
        let _sequence: Option<i64> = ctx.sequence();
        sqlx::query("UPDATE orders SET paid = 1 WHERE id = $1")
            .bind(msg.order_id)
            .execute(&mut **ctx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Sqlite, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// A handler may return its own error type if it implements `std::error::Error`.
mod custom_error {
    use std::fmt;

    use inbox::prelude::*;

    use super::OrderPaid;

    #[derive(Debug)]
    enum BillingError {
        NegativeAmount(i64),
        Database(sqlx::Error),
    }

    impl fmt::Display for BillingError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Self::NegativeAmount(amount) => write!(f, "negative amount {amount}"),
                Self::Database(error) => write!(f, "database: {error}"),
            }
        }
    }

    impl std::error::Error for BillingError {}

    impl From<sqlx::Error> for BillingError {
        fn from(error: sqlx::Error) -> Self {
            Self::Database(error)
        }
    }

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> Result<(), BillingError> {
        if msg.amount < 0 {
            return Err(BillingError::NegativeAmount(msg.amount));
        }
        sqlx::query("UPDATE orders SET paid = paid + $1")
            .bind(msg.amount)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// A message that names its aggregate: the outbox publishes it in order within it.
mod derive_message_with_aggregate {
    use inbox::prelude::*;

    #[derive(Debug, Clone, Serialize, Deserialize, Message)]
    #[message(name = "order.placed", aggregate = "order_id")]
    struct OrderPlaced {
        event_id: Uuid,
        order_id: u64,
    }

    #[test]
    fn aggregate_is_the_field() {
        let placed = OrderPlaced {
            event_id: Uuid::nil(),
            order_id: 7,
        };
        assert_eq!(placed.aggregate().as_deref(), Some("7"));
    }
}

// A handler that takes only the message works with every database.
mod message_only {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn log_payment(msg: OrderPaid) -> Result<(), HandlerError> {
        let _ = msg.event_id;
        Ok(())
    }

    fn assert_handler<DB: inbox::Backend, H: Handler<DB, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler_on_every_database() {
        assert_handler::<sqlx::Postgres, _>(log_payment);
        assert_handler::<sqlx::Sqlite, _>(log_payment);
    }
}

// The message parameter may be a pattern that destructures the message.
mod message_pattern {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(
        tx: &mut sqlx::PgConnection,
        OrderPaid { order_id, .. }: OrderPaid,
    ) -> Result<(), HandlerError> {
        sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// `name = "..."` sets the dedup scope; `crate = "..."` finds inbox through a re-export.
mod name_and_crate {
    mod reexport {
        pub use inbox;
    }

    use reexport::inbox::prelude::*;

    #[derive(Debug, Clone, Serialize, Deserialize, Message)]
    #[message(name = "order.paid", crate = "reexport::inbox")]
    struct OrderPaid {
        event_id: Uuid,
    }

    #[inbox_handler(
        key = "event_id",
        name = "billing.mark_paid",
        crate = "reexport::inbox"
    )]
    async fn mark_paid(
        _tx: &mut sqlx::PgConnection,
        _msg: OrderPaid,
    ) -> Result<(), reexport::inbox::HandlerError> {
        Ok(())
    }

    #[test]
    fn names_are_the_given_ones() {
        assert_eq!(<OrderPaid as reexport::inbox::Message>::TYPE, "order.paid");
        assert_eq!(
            reexport::inbox::Handler::<sqlx::Postgres>::name(&mark_paid),
            "billing.mark_paid"
        );
    }
}

// A handler's own error type says which of its values are permanent.
mod permanent_error {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[derive(Debug)]
    enum ShopError {
        UnknownOrder(String),
        Database(sqlx::Error),
    }

    impl std::fmt::Display for ShopError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Self::UnknownOrder(order) => write!(f, "order {order} does not exist"),
                Self::Database(error) => write!(f, "database: {error}"),
            }
        }
    }

    impl std::error::Error for ShopError {}

    impl From<sqlx::Error> for ShopError {
        fn from(error: sqlx::Error) -> Self {
            Self::Database(error)
        }
    }

    impl inbox::Permanence for ShopError {
        fn is_permanent(&self) -> bool {
            matches!(self, Self::UnknownOrder(_))
        }
    }

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> Result<(), ShopError> {
        let updated = sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
            .bind(&msg.order_id)
            .execute(&mut *tx)
            .await?;
        if updated.rows_affected() == 0 {
            return Err(ShopError::UnknownOrder(msg.order_id));
        }
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// The design's example: a handler on a PostgreSQL connection with key, sequence and aggregate.
mod pg_connection {
    use inbox::prelude::*;

    #[derive(Debug, Clone, Serialize, Deserialize, Message)]
    #[message(name = "order.paid")]
    struct OrderPaid {
        event_id: Uuid,
        order_id: String,
        sequence: i64,
        amount: i64,
    }

    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
    async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> Result<(), HandlerError> {
        sqlx::query("UPDATE orders SET status = 'PAID', paid_amount = $1 WHERE id = $2")
            .bind(msg.amount)
            .bind(&msg.order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[allow(dead_code)]
    async fn process(pool: &sqlx::PgPool, msg: OrderPaid) -> Result<Outcome, inbox::Error> {
        mark_paid.process(pool, msg).await
    }

    #[test]
    fn is_a_handler_named_after_its_function() {
        assert_handler(mark_paid);
        assert_eq!(mark_paid.name(), "mark_paid");
    }
}

// The annotated name stays callable as the plain, unguarded function.
mod plain_call {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(
        _tx: &mut sqlx::SqliteConnection,
        _msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    #[inbox_handler(key = "event_id")]
    async fn log_payment(_msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    #[allow(dead_code)]
    async fn unit_test(
        conn: &mut sqlx::SqliteConnection,
        msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        mark_paid(&mut *conn, msg.clone()).await?;
        mark_paid(conn, msg.clone()).await?;
        log_payment(msg).await
    }
}

// A `pub` handler with doc comments, in a module with `missing_docs` denied: the docs land on the
// handler value and it stays reachable from outside the module.
pub mod pub_with_docs {
    #![deny(missing_docs)]
    //! A module with documented handlers, reachable from the crate's root, so that `missing_docs`
    //! checks what the macros generate.

    /// Billing's handlers.
    pub mod billing {
        use inbox::prelude::*;

        /// An order was paid.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        pub struct OrderPaid {
            /// The event's id.
            pub event_id: Uuid,
        }

        /// Marks the order as paid.
        ///
        /// Runs once per `event_id`.
        #[inbox_handler(key = "event_id")]
        pub async fn mark_paid(
            _tx: &mut sqlx::SqliteConnection,
            _msg: OrderPaid,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    fn assert_handler<H: inbox::Handler<sqlx::Sqlite, Message = billing::OrderPaid>>(_: H) {}

    #[test]
    fn is_reachable_from_outside_its_module() {
        assert_handler(billing::mark_paid);
    }
}

// A handler named with a raw identifier: its default dedup scope is the name without `r#`.
mod raw_identifier {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn r#match(_msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    #[test]
    fn name_has_no_raw_prefix() {
        assert_eq!(Handler::<sqlx::Sqlite>::name(&r#match), "match");
    }
}

// Generated code names only absolute paths: the prelude's names being shadowed at module level
// does not break it.
mod shadowing {
    #![allow(dead_code, non_camel_case_types)]

    use ::inbox::prelude::{Deserialize, HandlerError, Message, Serialize, Uuid, inbox_handler};

    struct Result;
    struct Ok;
    struct Err;
    struct Option;
    struct Some;
    struct None;
    struct Box;
    struct Vec;
    struct String;
    struct Send;
    struct Sync;
    struct Sized;
    struct Clone;
    struct Copy;
    struct Debug;
    struct Deref;
    struct Future;
    struct Pin;
    struct From;
    struct Into;
    struct Default;
    struct i64;
    struct core;
    struct std;
    struct __private;
    struct Handler;
    struct Context;
    struct Identity;
    struct Identifier;
    struct SequenceNumber;
    struct DatabaseHandle;
    struct HandlerResult;
    struct Backend;
    struct Error;
    struct BoxFuture;
    struct __InboxDb;
    struct __inbox_handler;
    struct __inbox_boxed;
    struct message;
    struct ctx;
    struct handle;
    mod inbox {}

    #[derive(::std::fmt::Debug, ::std::clone::Clone, Serialize, Deserialize, Message)]
    #[message(name = "order.paid")]
    struct OrderPaid {
        event_id: Uuid,
        order_id: ::std::string::String,
        sequence: ::core::primitive::i64,
    }

    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
    async fn mark_paid(
        _tx: &mut sqlx::SqliteConnection,
        _msg: OrderPaid,
    ) -> ::core::result::Result<(), HandlerError> {
        ::core::result::Result::Ok(())
    }

    #[inbox_handler(key = ["event_id", "order_id"])]
    async fn log_payment(_msg: OrderPaid) -> ::core::result::Result<(), HandlerError> {
        ::core::result::Result::Ok(())
    }

    #[inbox_handler(key = "event_id", name = "audit")]
    async fn audit(
        _ctx: &mut ::inbox::Context<'_, sqlx::Sqlite>,
        _msg: OrderPaid,
    ) -> ::core::result::Result<(), HandlerError> {
        ::core::result::Result::Ok(())
    }
}

// A handler on a SQLite connection.
mod sqlite_connection {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
    async fn mark_paid(
        tx: &mut sqlx::SqliteConnection,
        msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        sqlx::query("UPDATE orders SET paid = 1 WHERE id = $1")
            .bind(msg.order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Sqlite, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}

// A handler that takes the application's state: registered on the builder before it, or bound
// with `with_state` for a plain guarded call.
mod state {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[derive(Clone)]
    struct Rates {
        vat_percent: i64,
    }

    #[inbox_handler(key = "event_id")]
    async fn book_vat(
        tx: &mut sqlx::SqliteConnection,
        State(rates): State<Rates>,
        msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO vat (amount) VALUES ($1)")
            .bind(msg.amount * rates.vat_percent / 100)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    #[inbox_handler(key = "event_id", name = "notify")]
    async fn notify(State(_rates): State<Rates>, _msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Sqlite, Message = OrderPaid>>(_: H) {}

    async fn build(pool: sqlx::SqlitePool) -> Result<Inbox<sqlx::Sqlite>, inbox::BuildError> {
        Inbox::builder(pool)
            .state(Rates { vat_percent: 20 })
            .handler(book_vat)
            .handler(notify)
            .build()
            .await
    }

    #[test]
    fn is_a_handler_once_its_state_is_bound() {
        assert_handler(book_vat.with_state(Rates { vat_percent: 20 }));
        assert_handler(notify.with_state(Rates { vat_percent: 20 }));
        let _ = build;
    }
}

// Strict ordering, with and without a gap timeout: the handler reports it.
mod strict {
    use inbox::prelude::*;
    use std::time::Duration;

    use super::OrderPaid;

    #[inbox_handler(
        key = "event_id",
        sequence = "sequence",
        aggregate = "order_id",
        ordering = "strict"
    )]
    async fn by_default(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    #[inbox_handler(
        key = "event_id",
        sequence = "sequence",
        aggregate = "order_id",
        ordering = "strict",
        gap_timeout = "15m"
    )]
    async fn with_timeout(
        _tx: &mut sqlx::PgConnection,
        _msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    #[inbox_handler(
        key = "event_id",
        sequence = "sequence",
        aggregate = "order_id",
        ordering = "monotonic"
    )]
    async fn monotonic(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
        Ok(())
    }

    fn ordering<H: Handler<sqlx::Postgres>>(handler: H) -> inbox::Ordering {
        handler.ordering()
    }

    #[test]
    fn reports_its_ordering() {
        let strict = |gap_timeout| inbox::Ordering::Strict { gap_timeout };
        assert_eq!(ordering(by_default), strict(inbox::DEFAULT_GAP_TIMEOUT));
        assert_eq!(ordering(with_timeout), strict(Duration::from_secs(900)));
        assert_eq!(ordering(monotonic), inbox::Ordering::Monotonic);
    }
}

// A handler on `&mut sqlx::Transaction<'_, DB>`.
mod transaction {
    use inbox::prelude::*;

    use super::OrderPaid;

    #[inbox_handler(key = "event_id")]
    async fn mark_paid(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
            .bind(msg.order_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

    #[test]
    fn is_a_handler() {
        assert_handler(mark_paid);
    }
}
