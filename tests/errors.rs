//! The error model: a handler's own error type says which of its values are permanent, an
//! `anyhow` handler is retried like any other, and a `HandlerError` passes through
//! `Box<dyn Error>` (a test's `?`) with its permanence intact.

use std::error::Error as StdError;

use inbox::prelude::*;
use inbox::{Error, Permanence};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.order_placed")]
struct OrderPlaced {
    event_id: u64,
    order_id: String,
}

fn placed(event_id: u64, order_id: &str) -> OrderPlaced {
    OrderPlaced {
        event_id,
        order_id: order_id.into(),
    }
}

/// A shop's own error type: an unknown order is permanent, a database error is not.
#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("order {0} does not exist")]
    UnknownOrder(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl Permanence for ShopError {
    fn is_permanent(&self) -> bool {
        matches!(self, ShopError::UnknownOrder(_))
    }
}

#[inbox_handler(key = "event_id")]
async fn place(tx: &mut sqlx::SqliteConnection, msg: OrderPlaced) -> Result<(), ShopError> {
    if msg.order_id == "unknown" {
        return Err(ShopError::UnknownOrder(msg.order_id));
    }
    sqlx::query("INSERT INTO orders (id) VALUES ($1)")
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[inbox_handler(key = "event_id", name = "place_with_anyhow")]
async fn place_with_anyhow(
    tx: &mut sqlx::SqliteConnection,
    msg: OrderPlaced,
) -> anyhow::Result<()> {
    if msg.order_id == "refused" {
        return Err(anyhow::anyhow!("order {} is refused", msg.order_id));
    }
    sqlx::query("INSERT INTO orders (id) VALUES ($1)")
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

async fn database() -> sqlx::SqlitePool {
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    inbox::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// Whether the guarded call failed in the handler, and if so whether it will be retried.
fn retried(error: Error) -> bool {
    match error {
        Error::Handler { retry_after, .. } => retry_after.is_some(),
        other => panic!("expected a handler failure, got {other}"),
    }
}

#[tokio::test]
async fn a_value_its_type_calls_permanent_is_dead_at_its_first_attempt() {
    let pool = database().await;

    let error = place
        .process(&pool, placed(1, "unknown"))
        .await
        .unwrap_err();

    assert!(!retried(error), "an unknown order is permanent: no retry");
}

#[tokio::test]
async fn a_value_its_type_calls_transient_is_retried() {
    let pool = database().await;
    sqlx::query("INSERT INTO orders (id) VALUES ('o-1')")
        .execute(&pool)
        .await
        .unwrap();

    // The duplicate order id fails the insert: a database error, transient.
    let error = place.process(&pool, placed(1, "o-1")).await.unwrap_err();

    assert!(retried(error), "a database error is retried");
}

#[tokio::test]
async fn an_anyhow_handler_applies_and_its_errors_are_retried() {
    let pool = database().await;

    let outcome = place_with_anyhow.process(&pool, placed(1, "o-1")).await;
    let error = place_with_anyhow
        .process(&pool, placed(2, "refused"))
        .await
        .unwrap_err();

    assert_eq!(outcome.unwrap(), Outcome::Processed);
    assert!(retried(error), "an anyhow error is transient");
}

#[test]
fn a_handler_error_keeps_its_permanence_through_a_box() {
    let boxed: Box<dyn StdError + Send + Sync> =
        HandlerError::permanent("order 7 is closed").into();

    let error = HandlerError::new(boxed);

    assert!(error.is_permanent());
    assert_eq!(error.to_string(), "order 7 is closed");
}

/// The README's unit-test form: the handler called as a plain function, its error through `?`.
#[tokio::test]
async fn a_test_returning_box_dyn_error_calls_a_handler_with_the_question_mark()
-> Result<(), Box<dyn StdError>> {
    let pool = database().await;
    let mut conn = pool.acquire().await?;

    place(&mut conn, placed(1, "o-1")).await?;
    let refused = mark_refused(placed(2, "o-2")).await;

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await?;
    assert_eq!(count, 1);
    assert_eq!(refused.unwrap_err().to_string(), "order o-2 is refused");
    Ok(())
}

/// A test helper in the same form: `?` on a `HandlerError` inside `Result<_, Box<dyn Error>>`.
async fn mark_refused(msg: OrderPlaced) -> Result<(), Box<dyn StdError>> {
    always_refuses(msg).await?;
    Ok(())
}

#[inbox_handler(key = "event_id")]
async fn always_refuses(msg: OrderPlaced) -> Result<(), HandlerError> {
    Err(HandlerError::permanent(format!(
        "order {} is refused",
        msg.order_id
    )))
}
