// A handler's own error type says which of its values are permanent.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
}

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

fn main() {
    assert_handler(mark_paid);
}
