// A handler that takes the application's state: registered on the builder before it, or bound
// with `with_state` for a plain guarded call.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    amount: i64,
}

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

fn main() {
    assert_handler(book_vat.with_state(Rates { vat_percent: 20 }));
    assert_handler(notify.with_state(Rates { vat_percent: 20 }));
    let _ = build;
}
