// A composite key: the dedup identity is several fields together.
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

fn main() {
    assert_handler(record_invoice);
}
