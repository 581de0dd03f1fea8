//! Handler state and the builder's checks: a handler takes `State<T>` registered on the builder
//! (or a part of a larger state, through `FromRef`), a handler bound to its state is a plain
//! handler, and the builder refuses an inbox without handlers and a retry policy for a handler
//! it does not register.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use inbox::prelude::*;
use inbox::{BuildError, FromRef, RetryPolicy};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.order_paid")]
struct OrderPaid {
    event_id: u64,
    amount: i64,
}

/// What the application shares with its handlers: a rate, and a counter the test reads back.
#[derive(Clone)]
struct Shop {
    vat_percent: i64,
    calls: Arc<AtomicU64>,
}

/// A larger state from which handlers take their part.
#[derive(Clone)]
struct App {
    shop: Shop,
}

impl FromRef<App> for Shop {
    fn from_ref(app: &App) -> Shop {
        app.shop.clone()
    }
}

#[inbox_handler(key = "event_id")]
async fn book_vat(
    tx: &mut sqlx::SqliteConnection,
    State(shop): State<Shop>,
    msg: OrderPaid,
) -> Result<(), HandlerError> {
    shop.calls.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO vat (event_id, amount) VALUES ($1, $2)")
        .bind(msg.event_id as i64)
        .bind(msg.amount * shop.vat_percent / 100)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Takes state and no database handle.
#[inbox_handler(key = "event_id", name = "count_calls")]
async fn count_calls(State(shop): State<Shop>, _msg: OrderPaid) -> Result<(), HandlerError> {
    shop.calls.fetch_add(100, Ordering::SeqCst);
    Ok(())
}

async fn database() -> sqlx::SqlitePool {
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    inbox::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE vat (event_id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

fn shop(vat_percent: i64) -> Shop {
    Shop {
        vat_percent,
        calls: Arc::new(AtomicU64::new(0)),
    }
}

fn paid(event_id: u64, amount: i64) -> Envelope {
    Envelope::encode(format!("paid-{event_id}"), &OrderPaid { event_id, amount }).unwrap()
}

async fn vat(pool: &sqlx::SqlitePool) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT event_id, amount FROM vat ORDER BY event_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_handler_receives_the_state_registered_on_the_builder() {
    let pool = database().await;
    let shop = shop(20);
    let inbox = Inbox::builder(pool.clone())
        .state(shop.clone())
        .handler(book_vat)
        .handler(count_calls)
        .build()
        .await
        .unwrap();

    inbox.dispatch(&paid(1, 50)).await.unwrap();
    inbox.dispatch(&paid(2, 200)).await.unwrap();
    inbox.dispatch(&paid(2, 200)).await.unwrap();

    assert_eq!(vat(&pool).await, [(1, 10), (2, 40)]);
    assert_eq!(
        shop.calls.load(Ordering::SeqCst),
        202,
        "each handler ran once per message"
    );
}

#[tokio::test]
async fn a_handler_takes_its_part_of_a_larger_state() {
    let pool = database().await;
    let app = App { shop: shop(10) };
    let inbox = Inbox::builder(pool.clone())
        .state(app.clone())
        .handler(book_vat)
        .build()
        .await
        .unwrap();

    inbox.dispatch(&paid(1, 70)).await.unwrap();

    assert_eq!(vat(&pool).await, [(1, 7)]);
    assert_eq!(app.shop.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_handler_bound_to_its_state_is_processed_without_a_runtime() {
    let pool = database().await;
    let bound = book_vat.with_state(shop(25));

    let first = bound
        .process(
            &pool,
            OrderPaid {
                event_id: 1,
                amount: 40,
            },
        )
        .await;
    let again = bound
        .process(
            &pool,
            OrderPaid {
                event_id: 1,
                amount: 40,
            },
        )
        .await;

    assert_eq!(first.unwrap(), Outcome::Processed);
    assert_eq!(again.unwrap(), Outcome::Duplicate);
    assert_eq!(vat(&pool).await, [(1, 10)]);
}

#[tokio::test]
async fn an_inbox_without_handlers_is_a_build_error() {
    let pool = database().await;

    let error = Inbox::builder(pool).build().await.err().unwrap();

    assert!(matches!(error, BuildError::NoHandlers), "{error}");
}

#[tokio::test]
async fn a_retry_policy_for_a_handler_that_is_not_registered_is_a_build_error() {
    let pool = database().await;

    let error = Inbox::builder(pool)
        .state(shop(20))
        .handler(book_vat)
        .retry_for(count_calls, RetryPolicy::new(10))
        .build()
        .await
        .err()
        .unwrap();

    assert!(
        matches!(error, BuildError::RetryForUnregistered("count_calls")),
        "{error}"
    );
    assert!(
        error.to_string().contains(".handler(count_calls)"),
        "{error}"
    );
}

#[tokio::test]
async fn a_retry_policy_applies_to_the_handler_it_names() {
    let pool = database().await;
    let inbox = Inbox::builder(pool.clone())
        .state(shop(20))
        .handler(book_vat)
        .retry_for(book_vat, RetryPolicy::new(1))
        .build()
        .await
        .unwrap();
    sqlx::query("DROP TABLE vat").execute(&pool).await.unwrap();

    let error = inbox.dispatch(&paid(1, 50)).await.unwrap_err();

    assert!(
        matches!(
            error,
            inbox::Error::Handler {
                retry_after: None,
                attempt: 1,
                ..
            }
        ),
        "one attempt, then dead: {error}"
    );
}
