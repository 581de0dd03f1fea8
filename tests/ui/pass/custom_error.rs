// A handler may return its own error type if it implements `std::error::Error`.
use std::fmt;

use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    amount: i64,
}

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

fn main() {
    assert_handler(mark_paid);
}
